"""`devprof run --workers N`'s launcher: how many workers this machine can run, the grace each worker gets
when the job is stopped, and what it prints. In-process, with fake worker processes: no TensorFlow."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from cli_checks import TINY_RUN, files_under, one_usage_error
from profiler import cli
from profiler.cli import launcher
from profiler.record.console import Console


@pytest.fixture
def no_workers_start(monkeypatch):
    """Fail at once if a test that expects a refusal gets as far as starting worker processes."""

    def refuse(self):
        raise AssertionError("the launcher started its workers")

    monkeypatch.setattr(launcher._Job, "run", refuse)
    monkeypatch.delenv("TF_CONFIG", raising=False)


# ---------------------------------------------------------------- --workers the machine cannot run


@pytest.mark.parametrize(
    "workers, cores, available_gib, expect",
    [
        (64, 2, 22.0, "more workers than this machine has cores (2)"),
        (3, 2, 22.0, "use --workers 2 or fewer"),
        (4, 16, 5.0, "needs about 6.0 GiB of memory"),
        (4, 16, 5.0, "use --workers 3 or fewer"),
    ],
)
def test_more_workers_than_the_machine_runs_are_refused(
    tmp_path, capsys, monkeypatch, no_workers_start, workers, cores, available_gib, expect
):
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

    def run(self):
        started.append(self.args.workers)
        return 0

    monkeypatch.setattr(launcher._Job, "run", run)
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
    """Stands for a worker's subprocess.Popen: it never ends by itself and records its signals."""

    def __init__(self):
        self.pid = 1
        self.signals: list[int] = []

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
        process = cast(subprocess.Popen, _FakeProcess())
        job.workers.append(launcher.Worker(index, process, tmp_path / f"worker-{index}.log"))
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
                setattr(worker.process, "poll", lambda: -9)  # it has ended
        now[0] += 0.5

    monkeypatch.setattr(launcher.time, "sleep", sleep)
    job._watch()
    assert [w.signalled for w in job.workers] == [["SIGTERM", "SIGKILL"]] * 2
    assert [cast(_FakeProcess, w.process).signals for w in job.workers] == [[signal.SIGTERM, signal.SIGKILL]] * 2
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

    def sleep(seconds):
        for w in job.workers:
            setattr(w.process, "poll", lambda: -9)  # each has ended

    monkeypatch.setattr(launcher.time, "sleep", sleep)
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
        return launcher.Worker(index, cast(subprocess.Popen, _FakeProcess()), tmp_path / f"worker-{index}.log")

    monkeypatch.setattr(job, "_start", start)
    monkeypatch.setattr(job, "_watch", lambda: None)
    monkeypatch.setattr(job, "_conclude", lambda: 143)
    monkeypatch.setattr(job, "_note_pids", lambda: None)
    assert job.run() == 143
    assert started == [0, 1]


# ---------------------------------------------------------------- environment variables


@pytest.mark.parametrize("variable", ["DEVPROF_CLUSTER_WAIT_S", "DEVPROF_TPU_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_a_bad_environment_variable_stops_a_job_before_its_folder_exists(
    tmp_path, capsys, monkeypatch, no_workers_start, variable, value
):
    monkeypatch.setenv(variable, value)
    out = tmp_path / "runs"
    code = cli.main([*TINY_RUN, "--workers", "2", "--out", str(out), "--run-name", "job"])
    line = one_usage_error(code, capsys)
    assert variable in line and repr(value) in line, line
    assert files_under(tmp_path) == []  # no job folder to block the name


# ---------------------------------------------------------------- what it says


def test_one_worker_is_not_announced_as_workers(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launcher._Job, "run", lambda self: 0)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    args = [a for a in TINY_RUN if a != "--quiet"]
    assert cli.main([*args, "--workers", "1", "--out", str(tmp_path), "--run-name", "j"]) == 0
    out = capsys.readouterr().out
    assert ": 1 worker on this machine" in out and "1 workers" not in out, out
