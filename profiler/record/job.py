"""A multi-worker job's own run.json, at `<out>/<run-name>/run.json` beside its `worker-<i>/` folders.

The chief (worker 0) writes it when it starts and when it ends; `devprof run --workers N`
writes it before it starts the workers and, once they have all ended, with every worker's
outcome. Each worker's own run directory is a complete run directory of its own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from analysis.read import run_files
from profiler.device import cluster as cluster_mod
from profiler.record import rundir
from profiler.record.version import __version__

JOB_ID_ENV = "DEVPROF_JOB_ID"  # set by `devprof run --workers N` for its workers: the job run.json is theirs
STRATEGY = "MultiWorkerMirroredStrategy"


def run_json(job_dir: Path) -> Path:
    return Path(job_dir) / run_files.RUN_JSON


def read(job_dir: Path) -> dict | None:
    """The job's run.json, or None where there is none (or it cannot be read)."""
    try:
        return run_files.read_run_json(run_json(job_dir))
    except run_files.RunFileError:
        return None


def check_free(job_dir: Path, job_id: str | None) -> None:
    """Raise RunExistsError when `job_dir` already holds another job (runs are never overwritten).
    A folder that other workers of this job made first is fine; so is the launcher's run.json."""
    if not run_json(job_dir).exists():
        return
    found = read(job_dir) or {}
    if job_id is not None and found.get("job_id") == job_id:
        return
    raise rundir.RunExistsError(
        f"run directory {job_dir} already holds a job; runs are never overwritten (choose another --run-name or --out)"
    )


def new_meta(config, addresses: list[str], job_id: str | None) -> dict:
    """The job's run.json at start for `devprof run`: what it is asked to do, and its workers."""
    from dataclasses import asdict

    options = asdict(config)
    options.update(options.pop("train"))
    options.pop("cluster", None)
    if config.limit_test_images:  # validation uses at most that many (the chief records the exact number)
        options["validation_images"] = min(options["validation_images"], config.limit_test_images)
    return meta_for(options, addresses, job_id, config.train.batch_size)


def meta_for(options: dict, addresses: list[str], job_id: str | None, global_batch_size: int | None) -> dict:
    """The job's run.json at start: its options (`config`), its workers and their batch."""
    workers = len(addresses)
    meta = {
        "status": "running",
        "error": None,
        "devprof_version": __version__,
        "job_id": job_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "start_time_s": time.time(),
        "finished_at": None,
        "command": sys.argv,
        "strategy": STRATEGY,
        "num_workers": workers,
        "workers": [cluster_mod.worker_name(i) for i in range(workers)],
        "addresses": list(addresses),
        "global_batch_size": global_batch_size,
        "per_worker_batch_size": global_batch_size // max(workers, 1) if global_batch_size else None,
        "config": options,
    }
    return meta


def worker_outcomes(job_dir: Path, workers: int) -> dict[str, dict]:
    """`{"worker-<i>": {"status", "error", ...}}` for each worker whose run.json can be read."""
    found = {}
    for index in range(workers):
        name = cluster_mod.worker_name(index)
        try:
            meta = run_files.read_run_json(Path(job_dir) / name / run_files.RUN_JSON)
        except run_files.RunFileError:
            continue
        found[name] = {key: meta.get(key) for key in ("status", "error", "interrupted_by") if key in meta}
        if found[name].get("error"):
            found[name]["error"] = error_summary(str(found[name]["error"]))
    return found


def error_summary(text: str) -> str:
    """The line of an error that says what happened. TensorFlow's op errors start with where the
    op was defined ("Graph execution error:", "Detected at node ...", stack frames): skipped."""
    kind, sep, rest = text.partition(": ")
    if not sep or " " in kind:
        kind, rest = "", text
    for line in rest.splitlines():
        line = line.strip()
        if not line or line.startswith(("File ", "Detected at node", "[[", "Graph execution error")):
            continue
        return f"{kind}: {line}" if kind else line
    return text.strip().splitlines()[0] if text.strip() else text


def write(job_dir: Path, meta: dict) -> None:
    rundir.write_json_atomic(run_json(job_dir), meta)


def job_id_from_environment() -> str | None:
    return os.environ.get(JOB_ID_ENV) or None
