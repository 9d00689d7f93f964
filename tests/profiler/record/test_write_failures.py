"""A file of the run directory that cannot be written (a full disk: ENOSPC, injected here) ends the
run `failed` with the reason, in run.json and as one `error:` line; a trace that cannot be written
is a warning that says the trace is incomplete and why, also on a real full disk, and training goes on."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from profiler import cli
from profiler.record import rundir

pytestmark = pytest.mark.slow  # every test here trains, imports TensorFlow or starts a process

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
FULL = "[Errno 28] No space left on device"


@pytest.fixture(autouse=True)
def small_test_set(monkeypatch):
    """1,000 test images instead of 10,000: the end-of-run test pass is not what these tests check."""
    import models.data as data_mod

    full = data_mod.synthetic
    monkeypatch.setattr(
        data_mod, "synthetic", lambda n, test_images=1000, seed=0: full(n, min(test_images, 1000), seed)
    )


def run_devprof(tmp_path, *extra):
    argv = [
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--limit-images",
        "300",
        "--epochs",
        "1",
        "--quiet",
        "--out",
        str(tmp_path),
        "--run-name",
        "r",
        *extra,
    ]
    return cli.main(argv), tmp_path / "r"


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


class FullAfter:
    """A file object that takes `budget` more writes, then fails every write and flush with ENOSPC."""

    def __init__(self, file, budget: int):
        self._file = file
        self.budget = budget
        self.full = False

    def write(self, text):
        if self.budget <= 0:
            self.full = True
            raise ENOSPC
        self.budget -= 1
        return self._file.write(text)

    def flush(self):
        if self.full:
            raise ENOSPC
        return self._file.flush()

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def test_full_disk_while_writing_steps_fails_the_run_and_run_json_says_so(tmp_path, monkeypatch, capsys):
    """The disk fills up at the third step; from then on run.json cannot be rewritten either, until
    the space the run set aside is given back: the last run.json still says `failed` and why."""
    disk = []
    original_init = rundir.StepsWriter.__init__

    def steps_writer(self, path):
        original_init(self, path)
        self._file = FullAfter(self._file, budget=2)  # the header is written; two steps fit
        self._writer = rundir.csv.writer(self._file)
        disk.append(self._file)

    real_write_json = rundir.write_json_atomic

    def write_json(path, data):
        if disk and disk[0].full and (Path(path).parent / rundir.RESERVE_NAME).exists():
            raise ENOSPC
        return real_write_json(path, data)

    monkeypatch.setattr(rundir.StepsWriter, "__init__", steps_writer)
    monkeypatch.setattr(rundir, "write_json_atomic", write_json)
    rc, path = run_devprof(tmp_path, "--no-profile", "--no-sample")
    assert rc == 1
    err = capsys.readouterr().err
    steps_csv = path / "steps.csv"
    assert error_lines(err) == [
        f"error: run failed: cannot write {steps_csv}: {FULL}; the run is marked failed in {path / 'run.json'}"
    ], err
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "failed" and meta["finished_at"]
    assert meta["error"] == f"WriteError: cannot write {steps_csv}: {FULL}"
    assert len(steps_csv.read_text().splitlines()) == 1 + 2  # the header and the steps that fit
    assert not (path / rundir.RESERVE_NAME).exists()


def test_scalars_that_cannot_be_closed_fail_the_run(tmp_path, monkeypatch, capsys):
    from profiler.record.scalars import Scalars

    def close(self):
        with self._writing():
            self.writer.close()
            raise ENOSPC  # the last events could not be flushed

    monkeypatch.setattr(Scalars, "close", close)
    rc, path = run_devprof(tmp_path, "--no-profile", "--no-sample")
    assert rc == 1
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "cannot write TensorBoard scalars" in lines[0] and FULL in lines[0], lines
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "failed" and "cannot write TensorBoard scalars" in meta["error"]
    assert meta["test"]["images"] == 1000  # training and the test pass finished; the record did not


def test_sampler_csv_that_cannot_be_written_fails_the_run(tmp_path, monkeypatch, capsys):
    from profiler.samplers import runner

    def open_full(path, *args, **kwargs):
        return FullAfter(open(path, *args, **kwargs), budget=3)  # header and two rows

    monkeypatch.setattr(runner, "open", open_full, raising=False)
    rc, path = run_devprof(tmp_path, "--no-profile", "--sample-interval", "0.05")
    assert rc == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    host_csv = path / "utilization" / "host.csv"
    lines = error_lines(err)
    assert lines == [
        f"error: run failed: cannot write {host_csv}: OSError: {FULL}; the run is marked failed in {path / 'run.json'}"
    ], err
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "failed" and str(host_csv) in meta["error"]
    host = meta["samplers"]["status"]["host"]
    assert host["rows"] == 2 and FULL in host["write_error"]


def _stop_that_fills_the_disk(monkeypatch, logdir: Path):
    """tf.profiler.experimental.stop() that leaves half a trace (of the run at `logdir`) and fails as TensorFlow
    does on a full disk."""
    import tensorflow as tf

    real_stop = tf.profiler.experimental.stop

    def stop(save=True):
        real_stop(save)
        traces = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))
        raw = traces[-1].read_bytes()
        traces[-1].write_bytes(raw[: len(raw) // 2])
        raise tf.errors.ResourceExhaustedError(None, None, f"{traces[-1]}; No space left on device")

    monkeypatch.setattr(tf.profiler.experimental, "stop", stop)
    return stop


def test_trace_on_a_full_disk_is_a_warning_and_its_part_is_deleted(tmp_path, monkeypatch, capsys):
    _stop_that_fills_the_disk(monkeypatch, tmp_path / "r")
    rc, path = run_devprof(tmp_path, "--no-sample", "--profile-steps", "1:2")
    assert rc == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "profiler failed to write its trace" in warnings[0], err
    assert "deleted to leave the space to training" in warnings[0] and not error_lines(err)
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "complete" and meta["error"] is None and meta["test"]["images"] == 1000
    prof = meta["profiler"]
    assert prof["trace_complete"] is False and "trace" not in prof and "partial_trace" not in prof
    assert "No space left on device" in prof["trace_error"]
    assert len(prof["warnings"]) == 1 and "No space left on device" in prof["warnings"][0]
    # Half a trace is of no use to any reader, and steps.csv and run.json need its space.
    assert not list(path.glob("plugins/profile/*/*.xplane.pb*"))


# A real full disk: a tmpfs mounted in a user namespace where the system allows it, else a file size
# limit (RLIMIT_FSIZE: a write past it fails with EFBIG, SIGXFSZ ignored).
SMALL_DISK_BYTES = 160 << 10  # the run's own files and a shrunken reserve fit; a 5-step trace (~150 kB) does not
_CHILD = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv.pop(1))
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv[0] = "devprof"
runpy.run_module("profiler", run_name="__main__")
"""


def _can_mount_tmpfs() -> bool:
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d"], capture_output=True
    )
    return probe.returncode == 0


def test_a_real_full_disk_while_the_trace_is_written_leaves_training_going(tmp_path, capsys):
    import shlex
    import subprocess
    import sys

    from analysis.worker import analyze_worker

    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    run = [
        sys.executable,
        "-c",
        _CHILD,
        "0",
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--limit-images",
        "200",
        "--limit-test-images",
        "100",
        "--batch-size",
        "20",
        "--epochs",
        "1",
        "--profile-steps",
        "1:6",
        "--no-sample",
        "--quiet",
        "--out",
        str(disk),
        "--run-name",
        "r",
    ]
    tmpfs = _can_mount_tmpfs()
    if tmpfs:  # the tmpfs lives as long as the namespace: the run directory is copied out before it ends
        script = (
            f"mount -t tmpfs -o size={SMALL_DISK_BYTES} tmpfs {shlex.quote(str(disk))} && "
            f"{shlex.join(run)}; rc=$?; cp -a {shlex.quote(str(disk / 'r'))} {shlex.quote(str(kept))}; exit $rc"
        )
        done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
        path = kept
    else:
        run[3] = str(SMALL_DISK_BYTES // 2)
        done = subprocess.run(run, capture_output=True, text=True, timeout=300)
        path = disk / "r"
    assert done.returncode == 0, done.stderr
    assert "warning: profiler failed to write its trace" in done.stderr and "error:" not in done.stderr, done.stderr
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "complete" and meta["test"]["images"] == 100  # training and the test pass went on
    prof = meta["profiler"]
    assert prof["trace_complete"] is False and "trace" not in prof
    assert ("No space left on device" if tmpfs else "File too large") in prof["trace_error"], prof
    assert not list(path.glob("plugins/profile/*/*.xplane.pb"))
    assert ("partial_trace" in prof) is not tmpfs  # a full disk gets the space back; a file limit keeps the part
    assert len((path / "steps.csv").read_text().splitlines()) == 1 + 10
    analysis = analyze_worker(path)
    assert analysis.step_source == "steps_csv"
    said = " ".join(analysis.notes)
    assert "the profiler window ran but its trace could not be written" in said and prof["trace_error"] in said
    assert "run with the profiler window" not in said
    assert "the run failed" not in said


def test_a_complete_trace_says_so(tmp_path):
    rc, path = run_devprof(tmp_path, "--no-sample", "--profile-steps", "1:2")
    assert rc == 0
    prof = json.loads((path / "run.json").read_text())["profiler"]
    assert prof["trace_complete"] is True and (path / prof["trace"]).is_file()


def test_a_held_scalar_write_that_fails_neither_drops_the_others_nor_raises_on_the_flushing_thread():
    """Scalars held while the trace records are flushed together, maybe from a sampler's thread: a write
    that fails is recorded to fail the run (as a sampler's own does), and the writes after it still run."""
    import threading
    from types import SimpleNamespace
    from typing import cast

    from profiler.record.session import Session
    from profiler.record.tracing import ProfileWindow

    session = Session(SimpleNamespace(quiet=True))
    session.window = cast(ProfileWindow, SimpleNamespace(active=True))  # only whether it is active is read
    written = []

    def failing():
        raise rundir.WriteError(f"cannot write TensorBoard scalars: {FULL}")

    for write in (lambda: written.append(1), failing, lambda: written.append(3)):
        session._write_scalars(write)
    assert written == []  # held while the trace records
    session.window.active = False
    raised: list[Exception] = []
    flusher = threading.Thread(target=lambda: _record_raise(session._write_scalars, raised))
    flusher.start()
    flusher.join()
    assert raised == [] and written == [1, 3]
    assert session.write_errors == [f"cannot write TensorBoard scalars: {FULL}"]
    assert session._background_write_errors() == session.write_errors


def _record_raise(call, raised: list) -> None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - what would surface on a sampler's thread
        raised.append(exc)
