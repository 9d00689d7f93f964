"""Bad input and misplaced output: each is refused before anything is written, or reported,
with one `error:` or `warning:` line on stderr, and nothing on stdout that belongs on stderr.
In-process and without TensorFlow (fakes where it would be needed)."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli_checks import one_usage_error
from profiler import cli
from profiler.cli import launcher
from profiler.device import devices, quiet
from profiler.roofline import peak
from profiler.train.config import RunConfig, UsageError
from profiler.record.console import Console
from cli_checks import TINY_RUN, files_under
from fake_backend import _fake_cpu_run


@pytest.fixture
def no_workers_start(monkeypatch):
    """Fail at once if a test that expects a refusal gets as far as starting worker processes."""
    def refuse(self):
        raise AssertionError("the launcher started its workers")

    monkeypatch.setattr(launcher._Job, "run", refuse)
    monkeypatch.delenv("TF_CONFIG", raising=False)


# ---------------------------------------------------------------- 1. --workers the machine cannot run


@pytest.mark.parametrize("workers, cores, available_gib, expect", [
    (64, 2, 22.0, "more workers than this machine has cores (2)"),
    (3, 2, 22.0, "use --workers 2 or fewer"),
    (4, 16, 5.0, "needs about 6.0 GiB of memory"),
    (4, 16, 5.0, "use --workers 3 or fewer"),
])
def test_more_workers_than_the_machine_runs_are_refused(tmp_path, capsys, monkeypatch, no_workers_start, workers,
                                                        cores, available_gib, expect):
    monkeypatch.setattr(launcher, "machine_capacity", lambda: (cores, int(available_gib * 2**30)))
    out = tmp_path / "runs"
    code = cli.main([*TINY_RUN, "--workers", str(workers), "--batch-size", str(4 * workers * 16), "--out", str(out)])
    line = one_usage_error(code, capsys)
    assert expect in line and "--oversubscribe" in line, line
    assert files_under(tmp_path) == []  # nothing written


def test_the_number_of_workers_is_checked_before_what_depends_on_it(tmp_path, capsys, monkeypatch, no_workers_start):
    """`--workers 64` with the default batch of 100: the advice is about the workers, not how
    to split the batch among 64 of them."""
    monkeypatch.setattr(launcher, "machine_capacity", lambda: (2, 22 * 2**30))
    line = one_usage_error(cli.main(["run", "--workers", "64", "--out", str(tmp_path / "runs")]), capsys)
    assert "more workers than this machine has cores (2)" in line, line
    assert files_under(tmp_path) == []


def test_what_fits_is_not_refused():
    gib = 2**30
    assert launcher.capacity_problem(2, cores=2, available=4 * gib) is None
    assert launcher.capacity_problem(1, cores=1, available=gib // 2) is None  # one worker is one ordinary run
    assert launcher.capacity_problem(2, cores=4, available=None) is None  # memory unknown: not a reason
    assert launcher.capacity_problem(3, cores=2, available=None) is not None


def test_the_real_machine_is_measured():
    cores, available = launcher.machine_capacity()
    assert 1 <= cores <= (os.cpu_count() or 1)
    assert available is None or available > 0


def test_oversubscribe_starts_them_anyway(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(launcher._Job, "run", lambda self: started.append(self.args.workers) or 0)
    monkeypatch.setattr(launcher, "machine_capacity", lambda: (2, 2**30))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    args = [*TINY_RUN, "--workers", "4", "--batch-size", "64", "--out", str(tmp_path), "--run-name", "j"]
    assert cli.main(args) == 2
    capsys.readouterr()
    assert cli.main([*args, "--oversubscribe"]) == 0
    assert started == [4]


def test_oversubscribe_is_the_launchers_own_option():
    from profiler.cli.commands import run as run_command

    parser = cli.build_parser()
    args = parser.parse_args(["run", "--workers", "4", "--oversubscribe"])
    assert "--oversubscribe" not in launcher.child_options(args, run_command.OPTIONS)


class _FakeProcess:
    def __init__(self):
        self.pid = 1
        self.signals = []

    def poll(self):
        return None

    def send_signal(self, signum):
        self.signals.append(signum)

    def kill(self):
        self.signals.append(signal.SIGKILL)

    def wait(self):
        return -9


def _job_with_workers(tmp_path, run_json_for=()) -> launcher._Job:
    """A launcher's job of two workers that never end by themselves; `run_json_for`: the workers
    that have their run directory (training), the others are still starting."""
    args = SimpleNamespace(workers=2, epochs=1, quiet=True)
    job = launcher._Job(args, tmp_path, "id", [1, 2], None, [], Console(True))
    for index in range(2):
        job.workers.append(launcher.Worker(index, _FakeProcess(), tmp_path / f"worker-{index}.log"))
    for index in run_json_for:
        (tmp_path / f"worker-{index}").mkdir()
        (tmp_path / f"worker-{index}" / "run.json").write_text("{}")
    return job


def _kill_times(folder: Path, monkeypatch, run_json_for) -> dict[int, float]:
    """When the watch loop SIGKILLs each of two workers that ignore SIGTERM, on a fake clock
    that starts at 100 s when the launcher got SIGTERM and moves 0.5 s per poll."""
    folder.mkdir()
    now = [100.0]
    monkeypatch.setattr(launcher.time, "monotonic", lambda: now[0])
    job = _job_with_workers(folder, run_json_for=run_json_for)
    job.stop_signal = signal.SIGTERM
    killed = {}

    def sleep(seconds):
        for worker in job.workers:
            if worker.killed and worker.index not in killed:
                killed[worker.index] = now[0]
                worker.process.poll = lambda: -9
        now[0] += 0.5

    monkeypatch.setattr(launcher.time, "sleep", sleep)
    job._watch()
    assert [w.signalled for w in job.workers] == [["SIGTERM", "SIGKILL"]] * 2
    assert [w.process.signals for w in job.workers] == [[signal.SIGTERM, signal.SIGKILL]] * 2
    return killed


def test_a_worker_still_starting_is_killed_after_a_short_grace(tmp_path, monkeypatch):
    """Worker 1 is training (it has its run.json): it gets the full grace period to finish its
    run directory; worker 0 is still starting (TensorFlow may hold SIGTERM then, and there is
    nothing to save): it is killed after the short one."""
    assert launcher.STARTING_GRACE_S < launcher.GRACE_S
    killed = _kill_times(tmp_path / "one", monkeypatch, run_json_for=(1,))
    assert killed == {0: 100 + launcher.STARTING_GRACE_S, 1: 100 + launcher.GRACE_S}
    killed = _kill_times(tmp_path / "both", monkeypatch, run_json_for=(0, 1))
    assert killed == {0: 100 + launcher.GRACE_S, 1: 100 + launcher.GRACE_S}


def test_asked_twice_kills_at_once(tmp_path, monkeypatch):
    """Ctrl-C twice: each worker still gets the signal first, then SIGKILL without waiting (the
    clock stands still, so only the second Ctrl-C can end the grace period)."""
    monkeypatch.setattr(launcher.time, "monotonic", lambda: 0.0)
    job = _job_with_workers(tmp_path, run_json_for=(0, 1))
    job._on_signal(signal.SIGINT, None)
    job._on_signal(signal.SIGINT, None)
    monkeypatch.setattr(launcher.time, "sleep", lambda s: [setattr(w.process, "poll", lambda: -9)
                                                           for w in job.workers])
    job._watch()
    assert [w.signalled for w in job.workers] == [["SIGINT", "SIGKILL"]] * 2


def test_no_more_workers_start_once_the_launcher_is_stopped(tmp_path, monkeypatch):
    job = _job_with_workers(tmp_path)
    job.workers.clear()
    job.args.workers = 5
    started = []

    def start(index):
        started.append(index)
        if index == 1:
            job._on_signal(signal.SIGTERM, None)  # the signal arrives while worker 1 starts
        return launcher.Worker(index, _FakeProcess(), tmp_path / f"worker-{index}.log")

    monkeypatch.setattr(job, "_start", start)
    monkeypatch.setattr(job, "_watch", lambda: None)
    monkeypatch.setattr(job, "_conclude", lambda: 143)
    monkeypatch.setattr(job, "_note_pids", lambda: None)
    assert job.run() == 143
    assert started == [0, 1]


# ---------------------------------------------------------------- 2. --run-name control characters


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "tab\there", "bell\x07", "del\x7f", "nel\x85", "line\u2028sep",
                                  "=1+2\n"])
def test_run_name_with_control_characters_is_refused(tmp_path, capsys, name):
    out = tmp_path / "runs"
    line = one_usage_error(cli.main([*TINY_RUN, "--out", str(out), "--run-name", name]), capsys)
    assert "--run-name" in line and "control character" in line, line
    assert "\n" not in line and "\r" not in line  # the name is shown escaped, on one line
    assert files_under(tmp_path) == []


def test_printable_names_stay_allowed():
    for name in ("=1+2", "run|a", "é-ü", "a b", "日本"):
        RunConfig(run_name=name).validate()
    with pytest.raises(UsageError, match="control character U\\+000A"):
        RunConfig(run_name="a\nb").validate()


# ---------------------------------------------------------------- 9. DEVPROF_DEBUG


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("TRUE", True), ("Yes", True), (" 1 ", True),
                                       ("0", False), ("false", False), ("no", False), ("", False), ("off", False),
                                       ("2", False)])
def test_only_1_true_or_yes_turn_debugging_on(monkeypatch, value, on):
    monkeypatch.setenv("DEVPROF_DEBUG", value)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    assert quiet.debug() is on and quiet.verbose() is on


def test_debug_off_gives_one_line_for_a_bug(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("a bug")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser.set_defaults(handler=broken)
    monkeypatch.setenv("DEVPROF_DEBUG", "0")
    assert cli.main([]) == 1
    assert capsys.readouterr().err.startswith("error: None failed: RuntimeError: a bug")
    monkeypatch.setenv("DEVPROF_DEBUG", "yes")
    with pytest.raises(RuntimeError):
        cli.main([])


# ---------------------------------------------------------------- 10. capture options


@pytest.mark.parametrize("args, expect", [
    (["--duration-ms", "-5"], "--duration-ms must be a whole number of milliseconds from 1"),
    (["--duration-ms", "0"], "--duration-ms must be"),
    (["--duration-ms", str(2**31)], "--duration-ms must be"),
    (["--duration-ms", "nan"], "invalid int value"),
    (["--duration-ms", "inf"], "invalid int value"),
    (["--duration-ms", "1.5"], "invalid int value"),
    (["--host-tracer-level", "7"], "invalid choice"),
], ids=["negative", "zero", "too-long", "nan", "inf", "fraction", "tracer-level"])
def test_capture_options_are_checked_first(tmp_path, capsys, monkeypatch, args, expect):
    from profiler.record import tracing

    monkeypatch.setattr(tracing, "capture", lambda *a, **k: pytest.fail("capture was attempted"))
    out = tmp_path / "captures"
    line = one_usage_error(cli.main(["capture", "grpc://localhost:6009", *args, "--out", str(out)]), capsys)
    assert expect in line, line
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("address", ["grpc://localhost:0", "grpc://localhost:65536", "grpc://localhost:99999999999",
                                     "grpc://h:1,grpc://h2:0"])
def test_capture_ports_out_of_range(tmp_path, capsys, monkeypatch, address):
    from profiler.record import tracing

    monkeypatch.setattr(tracing, "capture", lambda *a, **k: pytest.fail("capture was attempted"))
    line = one_usage_error(cli.main(["capture", address, "--out", str(tmp_path / "c")]), capsys)
    assert "1 to 65535" in line, line
    assert files_under(tmp_path) == []


def test_capture_out_that_is_a_file(tmp_path, capsys, monkeypatch):
    from profiler.record import tracing

    monkeypatch.setattr(tracing, "capture", lambda *a, **k: pytest.fail("capture was attempted"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_usage_error(cli.main(["capture", "grpc://localhost:6009", "--out", str(blocker / "c")]), capsys)
    assert "--out" in line and "is a file" in line, line


# ---------------------------------------------------------------- 12. environment variables


@pytest.mark.parametrize("variable", ["DEVPROF_CLUSTER_WAIT_S", "DEVPROF_TPU_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_a_bad_environment_variable_stops_a_job_before_its_folder_exists(tmp_path, capsys, monkeypatch,
                                                                         no_workers_start, variable, value):
    monkeypatch.setenv(variable, value)
    out = tmp_path / "runs"
    code = cli.main([*TINY_RUN, "--workers", "2", "--out", str(out), "--run-name", "job"])
    line = one_usage_error(code, capsys)
    assert variable in line and repr(value) in line, line
    assert files_under(tmp_path) == []  # no job folder to block the name


def test_a_bad_environment_variable_stops_a_single_run_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DEVPROF_CLUSTER_WAIT_S", "-1")
    with pytest.raises(UsageError, match="DEVPROF_CLUSTER_WAIT_S"):
        RunConfig(out=str(tmp_path)).validate()
    monkeypatch.setenv("DEVPROF_CLUSTER_WAIT_S", "2.5")
    RunConfig(out=str(tmp_path)).validate()
    assert files_under(tmp_path) == []


# ---------------------------------------------------------------- 15. a peak that could not be cached


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_peak_says_when_its_result_could_not_be_cached(tmp_path, capsys, monkeypatch, fmt):
    monkeypatch.setattr(quiet, "import_tensorflow", lambda: None)
    monkeypatch.setattr(peak, "device_name", lambda device: "Fake CPU")
    monkeypatch.setattr(peak, "measure_peak", lambda device, name=None: {
        "device": device, "device_name": name, "format": peak.PEAK_FORMAT_VERSION,
        "matmul_flops_per_second": {"float32": 1e11}, "memory_bytes_per_second": 1e10})
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(blocker / "cache"))  # cannot be made: a file is in the way
    assert cli.main(["peak", "--format", fmt]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: the result could not be cached in "), captured.err
    assert str(blocker / "cache") in lines[0] and "DEVPROF_CACHE_DIR" in lines[0]
    if fmt == "json":
        assert "cache_error" in json.loads(captured.out)
    else:
        assert "matmul float32: 100.0 GFLOP/s" in captured.out and "warning" not in captured.out
    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(tmp_path / "cache"))  # a cache that works: no warning
    assert cli.main(["peak", "--format", fmt]) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- 16. noise


def test_an_unreachable_tpu_is_one_error_without_native_log_lines(capfd, monkeypatch):
    """TensorFlow logs the failed connection itself (an `E0000` line and gRPC's details) before
    the exception that the `error:` line is made from."""
    monkeypatch.delenv("DEVPROF_DEBUG", raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv(devices.TPU_TIMEOUT_ENV, "5")

    class UnreachableTPU:
        def tpu_strategy(self, address):
            os.write(2, b"E0000 00:00:1795469901.865310    4453 context_distributed_manager.cc:784] Received http2 "
                        b"header with status: 404\nAdditional GRPC error information from remote target "
                        b"/job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/GetStatus:\n"
                        b":UNKNOWN:Error received from peer  {grpc_status:12}\n")
            raise RuntimeError("Received http2 header with status: 404")

    with pytest.raises(devices.DeviceError, match="no TPU reachable at grpc://10.0.0.1:8470"):
        devices.resolve("tpu", tpu="grpc://10.0.0.1:8470", backend=UnreachableTPU())
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_reachable_tpu_still_shows_what_else_it_printed(capfd, monkeypatch):
    monkeypatch.delenv("DEVPROF_DEBUG", raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")

    class TPU:
        def tpu_strategy(self, address):
            os.write(2, b"I0000 00:00:1.0    1 tpu.cc:1] chatter\nsomething the user should see\n")
            return type("S", (), {"num_replicas_in_sync": 8})(), {"tpu": address, "cores": 8}

    assert devices.resolve("tpu", tpu="grpc://t:8470", backend=TPU()).kind == "tpu"
    assert capfd.readouterr().err == "something the user should see\n"


def test_with_debug_the_native_lines_show(capfd, monkeypatch):
    monkeypatch.setenv("DEVPROF_DEBUG", "1")

    class UnreachableTPU:
        def tpu_strategy(self, address):
            os.write(2, b"E0000 00:00:1.0    1 x.cc:1] refused\n")
            raise RuntimeError("refused")

    with pytest.raises(devices.DeviceError):
        devices.resolve("tpu", tpu="grpc://t:8470", backend=UnreachableTPU())
    assert "E0000" in capfd.readouterr().err


def test_notices_go_to_stderr(tmp_path, capsys, monkeypatch):
    from models import data as data_mod

    monkeypatch.setattr(data_mod, "keras_cache_dir", lambda: tmp_path / "no-keras-home")
    run = _fake_cpu_run(tmp_path, monkeypatch, data="auto")
    run.prepare()
    captured = capsys.readouterr()
    assert captured.err.startswith("notice: CIFAR-10 not found locally"), captured.err
    assert run.console.stream.getvalue() == "" and captured.out == ""
    quiet_run = _fake_cpu_run(tmp_path, monkeypatch, data="auto", quiet=True)
    quiet_run.console = Console(True)
    quiet_run.prepare()
    assert capsys.readouterr().err == ""  # --quiet: no notices either


def test_the_samplers_notice_goes_to_stderr(tmp_path, capsys, monkeypatch):
    from profiler import samplers

    class Group:
        def start(self):
            return None

        def status(self):
            return {"gpu": {"ran": False, "reason": "no GPU sampler: NVML not found"}}

    monkeypatch.setattr(samplers, "build_sampler_group", lambda *a, **k: Group())
    run = _fake_cpu_run(tmp_path, monkeypatch, sample=True)
    run.meta, run.path = {}, tmp_path / "r"
    run._start_samplers(devices.Resolved("cpu", None, {}))
    assert capsys.readouterr().err == "notice: no GPU sampler: NVML not found\n"
    assert run.console.stream.getvalue() == ""


def test_one_worker_is_not_announced_as_workers(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launcher._Job, "run", lambda self: 0)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    args = [a for a in TINY_RUN if a != "--quiet"]
    assert cli.main([*args, "--workers", "1", "--out", str(tmp_path), "--run-name", "j"]) == 0
    out = capsys.readouterr().out
    assert ": 1 worker on this machine" in out and "1 workers" not in out, out


# ---------------------------------------------------------------- 17. progress when not on a terminal


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_progress_lines_when_not_on_a_terminal():
    clock, stream = FakeClock(), io.StringIO()
    console = Console(False, stream=stream, clock=clock)
    console.epoch_begin(1, 2, 100)
    for step in range(1, 100):
        clock.now += 1.0  # a step a second: a line every 30 steps
        console.step(step, loss=2.0 - step / 100, accuracy=step / 200)
    lines = stream.getvalue().splitlines()
    assert lines == ["Epoch 1/2", "30/100 - 30s - loss: 1.7000 - accuracy: 0.1500",
                     "60/100 - 60s - loss: 1.4000 - accuracy: 0.3000",
                     "90/100 - 90s - loss: 1.1000 - accuracy: 0.4500"], lines


def test_no_progress_lines_when_steps_are_quick_or_quiet():
    clock, stream = FakeClock(), io.StringIO()
    console = Console(False, stream=stream, clock=clock)
    console.epoch_begin(1, 1, 100)
    for step in range(1, 101):
        clock.now += 0.1  # 10 s for the whole epoch
        console.step(step, 1.0, 0.5)
    assert stream.getvalue().splitlines() == ["Epoch 1/1"]
    quiet_stream = io.StringIO()
    silent = Console(True, stream=quiet_stream, clock=clock)
    silent.epoch_begin(1, 1, 100)
    for step in range(1, 100):
        clock.now += 60.0
        silent.step(step, 1.0, 0.5)
    assert quiet_stream.getvalue() == ""


def test_the_epoch_line_restarts_the_clock_of_progress_lines():
    from models.training import EpochResult

    clock, stream = FakeClock(), io.StringIO()
    console = Console(False, stream=stream, clock=clock)
    console.epoch_begin(1, 2, 10)
    clock.now += 29.0
    console.step(5, 1.0, 0.5)
    console.epoch_end(EpochResult(1, 30.0, 29.0, 100, 3.4, 1.0, 0.5, 1.0, 0.5, steps=10))
    console.epoch_begin(2, 2, 10)
    clock.now += 29.0
    console.step(5, 1.0, 0.5)
    assert not any(line.startswith("5/10") for line in stream.getvalue().splitlines())


def test_the_launcher_shows_progress_when_not_on_a_terminal(tmp_path):
    clock, stream = FakeClock(), io.StringIO()
    chief = tmp_path / "worker-0"
    chief.mkdir()
    (chief / "run.json").write_text(json.dumps({"status": "running", "steps_per_epoch": 20, "epochs": []}))
    progress = launcher._Progress(chief, 2, Console(False, stream=stream, clock=clock))
    steps = chief / "steps.csv"
    steps.write_text("epoch,step\n")
    for step in range(40):
        with open(steps, "a") as f:
            f.write(f"1,{step}\n")
        clock.now += 2.0
        progress.update()
    lines = stream.getvalue().splitlines()
    # The first update starts the clock: 30 s later step 16 of 20; 60 s later step 11 of epoch 2.
    assert lines == ["Epoch 1/2 - step 16/20", "Epoch 2/2 - step 11/20"], lines


# ---------------------------------------------------------------- 18. what the test pass does


def test_the_test_pass_says_how_many_images_it_evaluates():
    from profiler.train.run import evaluation_message

    assert evaluation_message(100, 100) == "Evaluating on the first 100 test images (--limit-test-images)..."
    assert evaluation_message(10_000, None) == "Evaluating on the whole test set (10,000 images)..."
    assert evaluation_message(10_000, 50_000) == "Evaluating on the whole test set (10,000 images)..."


def test_run_json_config_records_the_images_validated(tmp_path, monkeypatch):
    from profiler.record import session as session_mod

    monkeypatch.setattr(session_mod, "versions", lambda: {})
    run = _fake_cpu_run(tmp_path, monkeypatch, limit_test_images=200)
    resolved, arrays = run.prepare()
    meta = run._initial_meta(resolved, arrays)
    assert meta["config"]["validation_images"] == 200 == meta["data"]["val_images"]
    assert meta["config"]["limit_test_images"] == 200
    whole = _fake_cpu_run(tmp_path, monkeypatch, limit_test_images=None, run_name="w")
    resolved, arrays = whole.prepare()
    assert whole._initial_meta(resolved, arrays)["config"]["validation_images"] == 1000


def test_the_job_run_json_records_the_images_validated():
    from profiler.device import cluster as cluster_mod
    from profiler.record import job

    stand_in = cluster_mod.Cluster(("127.0.0.1:1", "127.0.0.1:2"), 0, "--workers",
                                   cluster_mod.local_tf_config([1, 2], 0))
    meta = job.new_meta(RunConfig(limit_test_images=200, cluster=stand_in), list(stand_in.workers), "id")
    assert meta["config"]["validation_images"] == 200
    assert job.new_meta(RunConfig(), ["a"], "id")["config"]["validation_images"] == 1000


# ---------------------------------------------------------------- 21. bfloat16 without bfloat16 units


X86_NO_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n"
X86_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
X86_AMX = "flags\t\t: fpu sse2 amx_bf16 amx_tile\n"
ARM_NO_BF16 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\n"
ARM_BF16 = "Features\t: fp asimd bf16 i8mm\n"


def test_cpu_flags_are_read_from_cpuinfo():
    assert devices.cpu_flags(X86_BF16) >= {"avx512_bf16", "sse2"}
    assert "asimd" in devices.cpu_flags(ARM_NO_BF16)
    assert devices.cpu_flags("model name: x\n") is None
    assert devices.cpu_flags() is None or isinstance(devices.cpu_flags(), set)


@pytest.mark.parametrize("cpuinfo, warned", [(X86_NO_BF16, "avx512_bf16 or amx_bf16"), (X86_BF16, None),
                                             (X86_AMX, None), (ARM_NO_BF16, "the bf16 feature"), (ARM_BF16, None)])
def test_bfloat16_on_a_cpu_without_bfloat16_units_is_warned(cpuinfo, warned):
    text = devices.precision_warning("mixed_bfloat16", "cpu", devices.cpu_flags(cpuinfo))
    if warned is None:
        assert text is None
    else:
        assert "no bfloat16 units" in text and warned in text and "float32" in text, text


def test_run_json_records_the_cpus_bfloat16_units(monkeypatch):
    """analyze reads files only: run.json's device says whether bfloat16 has units to run on."""
    assert devices.bfloat16_units(devices.cpu_flags(X86_NO_BF16)) == []
    assert devices.bfloat16_units(devices.cpu_flags(X86_BF16)) == ["avx512_bf16"]
    assert devices.bfloat16_units(devices.cpu_flags(ARM_BF16)) == ["bf16"]
    assert devices.bfloat16_units(None) is None
    read = devices.cpu_flags
    monkeypatch.setattr(devices, "cpu_flags", lambda text=None: read(X86_AMX))
    assert devices.cpu_info()["bfloat16_units"] == ["amx_bf16"]


def test_other_precisions_and_devices():
    flags = devices.cpu_flags(X86_NO_BF16)
    assert devices.precision_warning("float32", "cpu", flags) is None
    assert devices.precision_warning("mixed_bfloat16", "gpu", flags) is None
    assert devices.precision_warning("mixed_bfloat16", "cpu", None) is None  # flags unknown: say nothing
    assert "float16 has no fast kernels on CPUs" in devices.precision_warning("mixed_float16", "cpu", flags)


@pytest.mark.parametrize("precision, cpuinfo, expect", [
    ("mixed_bfloat16", X86_NO_BF16, "warning: this CPU has no bfloat16 units (avx512_bf16 or amx_bf16 not in"),
    ("mixed_bfloat16", X86_BF16, None),
    ("mixed_float16", X86_BF16, "warning: float16 has no fast kernels on CPUs"),
])
def test_a_run_warns_before_it_trains(tmp_path, capsys, monkeypatch, precision, cpuinfo, expect):
    read = devices.cpu_flags
    monkeypatch.setattr(devices, "cpu_flags", lambda text=None: read(cpuinfo))
    run = _fake_cpu_run(tmp_path, monkeypatch)
    run.config.train.precision = precision
    run.prepare()
    err = capsys.readouterr().err
    if expect is None:
        assert err == ""
    else:
        assert err.startswith(expect) and len(err.strip().splitlines()) == 1, err

