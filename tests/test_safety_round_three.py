"""The recording API and devprof's own loop under misuse, without TensorFlow: bad step counts, a
window that traces only the compile step, CIFAR-10 archives whose members are not what they
declare, and `--device tpu` where there is none."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import profiler
from profiler.record import tracing
from profiler.record.console import Console
from profiler.record.session import Session
from repo_paths import REPO

# ---------------------------------------------------------------- 12. images are a whole count


@pytest.mark.parametrize("images", [-1, 1.9, float("nan"), float("inf"), True, "32", [32]])
def test_step_images_must_be_a_whole_number_of_examples(tmp_path, images):
    session = profiler.profile(tmp_path / "runs")  # not entered: nothing is written
    with pytest.raises(ValueError, match=r"images must be a whole number >= 0 \(got "):
        session.step(images=images)
    assert not (tmp_path / "runs").exists()


def test_step_counts_that_are_whole_numbers_are_taken(tmp_path):
    session = profiler.profile(tmp_path / "runs")
    for images in (0, 32, np.int64(32), 32.0):
        assert session.step(images=images).images == int(images)
    assert session.step(steps=np.int32(4)).steps == 4
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        session.step(steps=2.5)


# ---------------------------------------------------------------- 13. a window of the compile step only


def _session(tmp_path, option_owner=Session):
    config = SimpleNamespace(tracer=tracing.TracerOptions(), quiet=True)
    session = option_owner(config, Console(True))
    session.path, session.meta = tmp_path, {"profiler": {}}
    return session


@pytest.mark.parametrize("start, stop, steps_per_call, warned", [
    (0, 1, 1, True), (0, 4, 4, True), (2, 3, 4, True),
    (0, 2, 1, False), (1, 2, 1, False), (0, 8, 4, False), (5, 15, 1, False),
])
def test_a_window_of_only_the_compile_step_is_warned_about(tmp_path, capsys, start, stop, steps_per_call, warned):
    session = _session(tmp_path)
    session._open_window(start, stop, "cpu", steps_per_call)
    warnings = [w for w in session.meta["profiler"].get("warnings", []) if "compiles" in w]
    err = capsys.readouterr().err
    if not warned:
        assert warnings == [] and "compiles" not in err
        return
    assert len(warnings) == 1 and f"profile window {start}:{stop} traces only" in warnings[0], warnings
    assert "--profile-steps " in warnings[0]  # devprof run's option
    assert f"warning: {warnings[0]}" in err


def test_the_compile_step_warning_names_profile_steps_in_api_terms(tmp_path):
    from profiler.api import ProfileSession

    session = _session(tmp_path, ProfileSession)
    session._open_window(0, 1, "cpu")
    (warning,) = session.meta["profiler"]["warnings"]
    assert 'profile_steps="1:11"' in warning and "--" not in warning, warning


# ---------------------------------------------------------------- 17. profile()'s errors in its own terms


def test_profile_errors_name_its_arguments_not_devprof_runs_options(tmp_path):
    from profiler.record.rundir import OutputError, RunExistsError

    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "a-file").write_text("")
    cases = [(dict(out=tmp_path / "runs", run_name="taken"), RunExistsError, "choose another run_name or out"),
             (dict(out=tmp_path / "a-file"), OutputError, "out "),
             (dict(out=tmp_path / "runs", run_name="a/b"), ValueError, "folder name inside out, not a path"),
             (dict(out=tmp_path / "runs", profile_steps="x"), ValueError, "profile_steps wants START:STOP")]
    for kwargs, kind, words in cases:
        with pytest.raises(kind) as raised:
            with profiler.profile(**kwargs):
                pass
        assert words in str(raised.value) and "--" not in str(raised.value), str(raised.value)
    assert profiler.RunExistsError is RunExistsError and profiler.OutputError is OutputError  # documented names
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["taken"]


def test_a_session_not_entered_records_nothing_and_says_so(tmp_path):
    session = profiler.profile(tmp_path / "runs")
    for what, use in (("session.step()", lambda: session.step().__enter__()),
                      ("session.iterate()", lambda: next(session.iterate([1]))),
                      ("session.epoch()", lambda: session.epoch().__enter__()),
                      ("session.log()", lambda: session.log(loss=1.0))):
        with pytest.raises(RuntimeError, match=f"{what.replace('(', '[(]').replace(')', '[)]')} outside the "
                                               "profile\\(\\) session's with block"):
            use()
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- 4. CIFAR-10 files larger than CIFAR-10's

DECLARED = 96 << 20  # three times the largest CIFAR-10 batch file; a few hundred kB of gzip


class _Zeros:
    """A file object of `size` zero bytes, made as it is read."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def _peak_bytes_while(function) -> tuple[BaseException | None, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        function()
    except Exception as exc:  # noqa: BLE001 - returned for the test to check
        raised = exc
    else:
        raised = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return raised, peak


def _assert_refused_unread(raised, peak, name):
    from models.data import DataError

    assert peak < 8 << 20, f"{peak:,} bytes allocated reading a file that was refused"
    assert isinstance(raised, DataError), raised
    assert f"{name}: declares {DECLARED:,} bytes, more than a CIFAR-10 batch file has" in str(raised), raised


def test_a_cifar10_archive_member_declaring_more_than_a_batch_is_refused_unread(tmp_path):
    import tarfile

    from models import data

    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        member = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        member.size = DECLARED
        tar.addfile(member, _Zeros(DECLARED))
        for name in ("data_batch_2", "test_batch"):
            tar.addfile(tarfile.TarInfo(f"cifar-10-batches-py/{name}"))  # empty: never reached
    assert archive.stat().st_size < 1 << 20
    raised, peak = _peak_bytes_while(lambda: data.load_cifar10(tmp_path))
    _assert_refused_unread(raised, peak, f"{archive}:data_batch_1")


@pytest.mark.parametrize("folder, name, test_name", [
    ("cifar-10-batches-py", "data_batch_1", "test_batch"),
    ("cifar-10-batches-bin", "data_batch_1.bin", "test_batch.bin"),
])
def test_a_cifar10_batch_file_larger_than_a_batch_is_refused_unread(tmp_path, folder, name, test_name):
    from models import data

    root = tmp_path / folder
    root.mkdir()
    (root / test_name).write_bytes(b"")
    with open(root / name, "wb") as sparse:  # no disk used: a hole of DECLARED bytes
        sparse.truncate(DECLARED)
    raised, peak = _peak_bytes_while(lambda: data.load_cifar10(tmp_path))
    _assert_refused_unread(raised, peak, str(root / name))


# ---------------------------------------------------------------- 19. --device tpu where there is none


class _TPUBackend:
    """A backend whose TPU lookup is recorded: it stands for TensorFlow's resolver, which waits."""

    def __init__(self):
        self.looked_up = []

    def tpu_strategy(self, address):
        self.looked_up.append(address)
        raise RuntimeError("no answer")

    def physical_devices(self, kind):
        return []


@pytest.fixture
def no_tpu_here(monkeypatch, tmp_path):
    from profiler.device import devices

    for name in devices.TPU_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "TPU_DEVICE_FILES", (str(tmp_path / "accel0"), str(tmp_path / "vfio0")),
                        raising=False)
    monkeypatch.setenv(devices.TPU_TIMEOUT_ENV, "1")  # an old lookup gives up soon, and the test says why
    return devices


def test_device_tpu_without_any_tpu_says_so_without_looking_it_up(no_tpu_here):
    devices = no_tpu_here
    backend = _TPUBackend()
    with pytest.raises(devices.DeviceError, match=r"no TPU reachable: this machine has no TPU device \(.*accel0"):
        devices.resolve("tpu", backend=backend)
    assert backend.looked_up == []  # TensorFlow's resolver, which waits for an absent TPU, was never asked


@pytest.mark.parametrize("hint", ["address", "TPU_NAME", "device file"])
def test_device_tpu_with_a_hint_still_looks_it_up(no_tpu_here, monkeypatch, tmp_path, hint):
    devices = no_tpu_here
    if hint == "TPU_NAME":
        monkeypatch.setenv("TPU_NAME", "my-tpu")
    if hint == "device file":
        (tmp_path / "vfio0").write_text("")
    backend = _TPUBackend()
    with pytest.raises(devices.DeviceError, match="no TPU reachable"):
        devices.resolve("tpu", tpu="grpc://10.0.0.9:8470" if hint == "address" else None, backend=backend)
    assert len(backend.looked_up) == 1


def test_devprof_run_device_tpu_without_a_tpu_is_a_usage_error_before_tensorflow_starts(no_tpu_here, tmp_path,
                                                                                       capsys):
    """Unmarked on purpose: the test suite fails a fast test that loads TensorFlow."""
    from cli_checks import one_usage_error

    from profiler import cli

    code = cli.main(["run", "--device", "tpu", "--out", str(tmp_path / "runs")])
    assert "no TPU reachable: this machine has no TPU device" in one_usage_error(code, capsys)
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- 15. no silent wait after the last epoch


class _Iterator:
    """Stands for a tf.data iterator, whose destructor can wait up to a minute for its autotuning
    thread: records that it was destroyed."""

    destroyed = 0

    def __init__(self, batches=()):
        self.batches = list(batches)

    def __iter__(self):
        return self

    def __next__(self):
        if not self.batches:
            raise StopIteration
        return self.batches.pop()

    def __del__(self):
        _Iterator.destroyed += 1


class _Dataset:
    def __iter__(self):
        return _Iterator([0, 1, 2])


def test_the_loop_keeps_its_finished_iterators_instead_of_waiting_to_destroy_them(monkeypatch):
    from models import training

    monkeypatch.setattr(training, "_retired", [], raising=False)
    monkeypatch.setattr(training, "_kept_at_exit", True, raising=False)  # this test process keeps its own exit
    _Iterator.destroyed = 0
    trainer = training.Trainer.__new__(training.Trainer)  # the loop's bookkeeping only: no TensorFlow
    trainer.hooks, trainer.config = training.LoopHooks(), SimpleNamespace(epochs=1)
    trainer._iterator = trainer._val_iterator = None

    def train_epoch(epoch):
        trainer._iterator, trainer._val_iterator = _Iterator(), _Iterator()

    trainer.train_epoch = train_epoch
    trainer.fit()
    assert trainer._iterator is None and trainer._val_iterator is None
    trainer.classification, trainer.test_ds = True, _Dataset()
    trainer._eval_one = lambda batch: (1.0, 1.0, 2.0)  # loss sum, correct, count
    result = trainer.evaluate()
    assert result == (0.5, 0.5)
    assert _Iterator.destroyed == 0, "destroyed on the loop's thread"
    assert len(training._retired) == 3  # training, validation, test


@pytest.mark.slow  # a subprocess; no TensorFlow
def test_kept_iterators_are_not_destroyed_when_the_process_exits(tmp_path):
    import subprocess
    import sys

    script = """
from models import training

class Iterator:
    def __del__(self):
        print("destroyed", flush=True)

training.retire_iterators([Iterator(), None])
print("exiting", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exiting"]  # no destructor ran at exit, so none waited
