"""A two-worker job folder with known numbers, made without TensorFlow: each `worker-<i>/` a run
directory (run.json, steps.csv, sampler summaries) with a synthetic trace of a synchronous
data-parallel step (`trace_fixtures.write_synthetic_device_trace`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trace_fixtures as fx
from compare_fixtures import make_run

SESSION = "2030_01_01_00_00_00"
# Every worker's traced step (the write_synthetic_session settings): gap 2, input copy 1.5,
# kernels 6, device copy 0.5, all-reduce 2 ms; the slow worker pays EXTRA_MS more host time
# before its launches, and the other one waits that long more in the all-reduce.
STEP = dict(
    gpus=1,
    kernel_ms=6.0,
    h2d_ms=1.5,
    d2d_ms=0.5,
    collective_ms=2.0,
    gap_ms=2.0,
    skew_ms=0.0,
    empty_gpus=0,
    custom_plane=False,
)
EXTRA_MS = 6.0
CALL_MS, OTHER_MS = 16.0, 0.5  # steps.csv: input 1.5 + call 16 + other 0.5 = the traced 18 ms step


@dataclass(frozen=True)
class Job:
    path: Path
    step_ms: float  # every worker's step (synchronous)
    compute_ms: float
    collective_ms: tuple  # per worker, the trace's wait in the all-reduce per step
    host_ms: tuple  # per worker, the trace's host overhead per step


def host_summary(cpu_pct: float, proc_cpu_pct: float, cores: int = 2) -> dict:
    """run.json sampler summaries of a host: the machine's CPU (`cpu_pct`, 0-100) and the process's (100 = a core)."""

    def stat(value: float) -> dict:
        return {"mean": value, "p50": value, "p95": value, "max": value}

    metrics = {"cpu_pct": stat(cpu_pct), "proc_cpu_pct": stat(proc_cpu_pct), "proc_rss_bytes": stat(5e8)}
    metrics.update({f"cpu{i}_pct": stat(cpu_pct) for i in range(cores)})
    return {"host": {"metrics": metrics}}


def write_job(
    root: Path,
    name: str = "job",
    *,
    slow_worker: int = 1,
    host: str = "vm",
    steps: int = 10,
    epoch_seconds=(2.0, 0.4, 0.4),
    cpu_pct: float = 100.0,
    proc_cpu_pct: float = 100.0,
) -> Job:
    """`root/name/` of two workers on one host: worker `slow_worker` does EXTRA_MS of host work per
    step, the other waits for it in the all-reduce. Both workers' samplers saw the machine's CPU at
    `cpu_pct` and their own process at `proc_cpu_pct` (100 = one of the 2 cores)."""
    job = Path(root) / name
    job.mkdir(parents=True)
    collectives, hosts, step_ms, compute_ms = [], [], None, None
    for i in range(2):
        worker = make_run(
            job,
            f"worker-{i}",
            epoch_seconds=epoch_seconds,
            steps=steps,
            images=50,
            input_ms=STEP["h2d_ms"],
            call_ms=CALL_MS,
            other_ms=OTHER_MS,
            batch_size=50,
            summaries=host_summary(cpu_pct, proc_cpu_pct),
        )
        meta = json.loads((worker / "run.json").read_text())
        meta["device"]["host"] = host
        meta["worker"] = {"index": i, "count": 2}
        (worker / "run.json").write_text(json.dumps(meta))
        params: dict[str, Any] = dict(STEP, steps=5, hostname=host)
        if i == slow_worker:
            params["lead_ms"] = EXTRA_MS
        else:
            params["collective_ms"] = STEP["collective_ms"] + EXTRA_MS
        made = fx.write_synthetic_device_trace(worker / "plugins" / "profile" / SESSION / f"{host}.xplane.pb", **params)
        step_ms, compute_ms = made.step_ms, STEP["kernel_ms"]
        collectives.append(made.devices["/device:GPU:0"]["collective_ms"])
        hosts.append(step_ms - STEP["h2d_ms"] - compute_ms - collectives[-1])
    (job / "run.json").write_text(
        json.dumps({"status": "complete", "workers": ["worker-0", "worker-1"], "num_workers": 2})
    )
    assert step_ms == STEP["h2d_ms"] + CALL_MS + OTHER_MS
    assert compute_ms is not None
    return Job(job, float(step_ms), compute_ms, tuple(collectives), tuple(hosts))
