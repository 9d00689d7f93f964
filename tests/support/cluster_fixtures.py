"""A job of many workers written as `devprof run --workers` leaves it, and a Dask cluster on loopback
to analyse it on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trace_fixtures as fx
from compare_fixtures import make_run
from repo_paths import REPO

SESSION = "2030_01_01_00_00_00"
SLOW = {5: ("host", 6.0), 11: ("input", 3.0)}  # worker -> (part, extra ms per step)
OFFSET_MS = 1.5  # worker i's clock reads i * OFFSET_MS later than worker 0's


@dataclass(frozen=True)
class Job:
    path: Path
    workers: int
    trace_events: int  # events in one worker's trace


def write_job(
    root: Path,
    workers: int = 16,
    slow: dict | None = None,
    *,
    steps: int = 5,
    listed: int | None = None,
    traced: range | None = None,
    name: str = "job",
) -> Job:
    """`root/name/` with `worker-<i>/` run directories (run.json, steps.csv and, for `traced`, a
    synthetic one-GPU trace); `listed` workers in the job's run.json (default: `workers`)."""
    slow = SLOW if slow is None else slow
    job = Path(root) / name
    job.mkdir(parents=True)
    worst = max((extra for _, extra in slow.values()), default=0.0)
    events = 0
    for i in range(workers):
        worker = make_run(job, f"worker-{i}", steps=10, images=50, batch_size=50)
        meta = json.loads((worker / "run.json").read_text())
        meta["device"]["host"] = f"node-{i}"
        meta["worker"] = {"index": i, "num_workers": workers}
        (worker / "run.json").write_text(json.dumps(meta))
        if traced is not None and i not in traced:
            continue
        part, extra = slow.get(i, (None, 0.0))
        params: dict[str, Any] = dict(
            gpus=1,
            steps=steps,
            kernel_ms=6.0,
            h2d_ms=1.5,
            d2d_ms=0.5,
            collective_ms=2.0 + worst - extra,
            gap_ms=2.0,
            skew_ms=0.0,
            empty_gpus=0,
            custom_plane=False,
            hostname=f"node-{i}",
            base_ns=fx.ABSOLUTE_BASE_NS + round(i * OFFSET_MS * 1e6),
        )
        if part == "host":
            params["lead_ms"] = extra
        elif part == "input":
            params["h2d_ms"] = 1.5 + extra
        made = fx.write_synthetic_device_trace(
            worker / "plugins" / "profile" / SESSION / f"node-{i}.xplane.pb", **params
        )
        events = made.launch_calls * 3
    count = workers if listed is None else listed
    (job / "run.json").write_text(
        json.dumps({"status": "complete", "num_workers": count, "workers": [f"worker-{i}" for i in range(count)]})
    )
    return Job(job, workers, events)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaskCluster:
    """`dask scheduler` and `workers` `dask worker` processes (no nanny: a killed one stays dead) on 127.0.0.1."""

    def __init__(self, folder: Path, workers: int = 2):
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(REPO), DASK_DISTRIBUTED__WORKER__DAEMON="False")
        dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
        self.logs = [
            open(folder / name, "w") for name in ("scheduler.log", *(f"worker{i}.log" for i in range(workers)))
        ]
        self.scheduler = subprocess.Popen(
            [*dask, "--host", "127.0.0.1", "--port", str(self.port), "--dashboard-address", ":0", "--no-show"],
            stdout=self.logs[0],
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        self.workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    self.address,
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--host",
                    "127.0.0.1",
                    "--dashboard-address",
                    ":0",
                    "--name",
                    f"w{i}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
            for i, log in enumerate(self.logs[1:])
        ]
        import distributed

        with distributed.Client(self.address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)

    def close(self) -> None:
        # The workers first: a worker told to close by its scheduler while it handles SIGTERM can hang.
        for group in (self.workers, [self.scheduler]):
            for process in group:
                if process.poll() is None:
                    process.terminate()
            for process in group:
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for log in self.logs:
            log.close()
