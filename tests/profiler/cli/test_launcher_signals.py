"""SIGTERM and Ctrl-C to `devprof run --workers N` stop every worker, with real processes: the
launcher is a real `devprof` process, its workers are small Python stand-ins (no TensorFlow),
one that stops when asked and one that ignores the signal, as a TensorFlow worker does while
it waits in the strategy's start-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repo_paths import REPO

# The stand-in worker: `stubborn` ignores SIGTERM and SIGINT and has no run directory (still
# starting); `polite` has its run.json (training) and exits when asked, as a worker does.
WORKER = r"""
import os, signal, sys, time
mode, run_json = sys.argv[1], sys.argv[2]
if mode == "stubborn":
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
else:
    os.makedirs(os.path.dirname(run_json), exist_ok=True)
    with open(run_json, "w") as f:
        f.write('{"status": "running"}')
    def stop(signum, frame):
        print("stopping on", signum, flush=True)
        sys.exit(128 + signum)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

# The launcher, with its workers' command replaced by the stand-in. Its grace period for a
# worker that trains is made far longer than the test waits: only the short grace of a worker
# still starting can end the stubborn one in time.
LAUNCHER = r"""
import sys
from profiler import cli
from profiler.cli import launcher

worker_script = sys.argv[1]
launcher.GRACE_S = 600.0


def command(self, index):
    mode = "stubborn" if index == 0 else "polite"
    return [sys.executable, worker_script, mode, str(self.job_dir / f"worker-{index}" / "run.json")]


launcher._Job.command = command
sys.exit(cli.main(sys.argv[2:]))
"""


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def wait_for(predicate, proc: subprocess.Popen, what: str, limit_s: float = 60.0) -> None:
    """Poll until `predicate()`; a guard against hanging, not a timing check."""
    began = time.monotonic()
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - began < limit_s, f"{what} did not happen"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from Linux /proc")
@pytest.mark.parametrize("signum, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_a_signal_to_the_launcher_stops_every_worker(tmp_path, signum, code, name):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = str(REPO)
    job = tmp_path / "runs" / "job"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(tmp_path / "launcher.py"),
            str(tmp_path / "worker.py"),
            "run",
            "--workers",
            "2",
            "--oversubscribe",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--quiet",
            "--out",
            str(tmp_path / "runs"),
            "--run-name",
            "job",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        logs = [job / f"worker-{i}.log" for i in (0, 1)]
        wait_for(lambda: all(log.exists() and "ready" in log.read_text() for log in logs), proc, "workers start")
        # the launcher notes the pids after it starts the workers: on a loaded machine they can be ready first
        wait_for(lambda: "pids" in json.loads((job / "run.json").read_text()).get("launcher", {}), proc, "pids noted")
        pids = json.loads((job / "run.json").read_text())["launcher"]["pids"]
        proc.send_signal(signum)
        # Far less than the 600 s grace a training worker would get: only the stubborn
        # worker's short grace as a worker still starting ends the job in time.
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, (stdout, stderr)
    assert f"{'terminated (SIGTERM)' if signum == signal.SIGTERM else 'interrupted'}: job" in stderr, stderr
    assert "Traceback" not in stderr
    assert not [name for name, pid in pids.items() if alive(pid)]  # nothing outlives the launcher
    meta = json.loads((job / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["interrupted_by"] == name
    exits = meta["launcher"]["exit_codes"]
    assert exits == {"worker-0": -signal.SIGKILL, "worker-1": 128 + signum}, exits
    assert f"stopping on {int(signum)}" in (job / "worker-1.log").read_text()
    polite = json.loads((job / "worker-1" / "run.json").read_text())
    assert polite["stopped_by_launcher"] == f"the launcher got {name}"


def _job_with_a_worker_that_said(tmp_path: Path, status: str, ended_after_the_stop: bool):
    """The launcher's bookkeeping after Ctrl-C: worker-1 ended (before or after the stop was passed on)
    with its own run.json saying `status`."""
    from types import SimpleNamespace

    from profiler.cli import launcher
    from profiler.record.console import Console

    own = {"status": status, "error": "UnavailableError: Collective ops is aborted by: peer gone", "traceback": "..."}
    (tmp_path / "worker-1").mkdir(parents=True)
    (tmp_path / "worker-1" / "run.json").write_text(json.dumps(own))
    job = launcher._Job(SimpleNamespace(workers=2, epochs=1), tmp_path, "id", [1, 2], None, [], Console(quiet=True))
    worker = launcher.Worker(1, subprocess.Popen([sys.executable, "-c", "pass"]), tmp_path / "worker-1.log")
    worker.process.wait()
    job.stop_signal, job.stop_sent_at = signal.SIGINT, 100.0
    worker.returncode, worker.ended_at, worker.signalled = 1, 100.5 if ended_after_the_stop else 99.0, ["SIGINT"]
    job._record_worker(worker, None)
    return json.loads((tmp_path / "worker-1" / "run.json").read_text())


@pytest.mark.slow  # starts a process (the stand-in worker's)
def test_a_worker_whose_collective_failed_as_its_peers_stopped_is_interrupted_as_they_are(tmp_path):
    meta = _job_with_a_worker_that_said(tmp_path / "after", "failed", ended_after_the_stop=True)
    assert meta["status"] == "interrupted" and meta["interrupted_by"] == "SIGINT" and meta["error"] is None
    assert meta["stop_note"].startswith("its collective failed as its peers stopped: UnavailableError")
    assert "traceback" not in meta
    # a worker that failed before the stop was passed on failed on its own, and says so
    before = _job_with_a_worker_that_said(tmp_path / "before", "failed", ended_after_the_stop=False)
    assert before["status"] == "failed" and before["error"].startswith("UnavailableError")
