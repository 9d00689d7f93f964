"""Run directories of whole epochs with known numbers (`make_run(root, name, ...)`), and `devprof compare`
called in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.read.run_files import STEPS_COLUMNS as STEP_COLUMNS
from profiler import cli
from repo_paths import REPO

SEED_TABLE = REPO / "examples" / "seed_table.csv"


def make_run(
    root,
    name,
    *,
    device="Test CPU",
    kind="cpu",
    epoch_seconds=(2.0, 0.6, 0.6),
    steps=10,
    images=100,
    input_ms=1.0,
    call_ms=50.0,
    other_ms=4.0,
    batch_size=100,
    precision="float32",
    flops_per_image=None,
    peak=None,
    summaries=None,
    steps_per_execution=1,
    status="complete",
):
    """A run directory with `steps` calls per epoch of exactly input/call/other ms and the given epoch seconds."""
    path = root / name
    path.mkdir(parents=True)
    rows, t = [], 1_700_000_000.0
    for epoch, _ in enumerate(epoch_seconds, start=1):
        for i in range(steps):
            rows.append(
                dict(
                    epoch=epoch,
                    step=(epoch - 1) * steps + i,
                    steps=steps_per_execution,
                    start_time_s=t,
                    input_ms=input_ms,
                    call_ms=call_ms,
                    other_host_ms=other_ms,
                    step_ms=input_ms + call_ms + other_ms,
                    images=images,
                )
            )
            t += 0.1
    pd.DataFrame(rows, columns=STEP_COLUMNS).to_csv(path / "steps.csv", index=False)
    meta = {
        "status": status,
        "config": {"batch_size": batch_size, "precision": precision, "steps_per_execution": steps_per_execution},
        "device": {"kind": kind, "name": device},
        "model": {"train_flops_per_image": flops_per_image} if flops_per_image else {},
        "steps_per_epoch": steps * steps_per_execution,
        "epochs": [
            {
                "epoch": e,
                "seconds": s,
                "train_seconds": s * 0.9,
                "images": steps * images,
                "images_per_second": steps * images / (s * 0.9),
            }
            for e, s in enumerate(epoch_seconds, start=1)
        ],
        "samplers": {"enabled": bool(summaries), "summaries": summaries or {}},
    }
    if peak is not None:
        meta["peak"] = peak
    (path / "run.json").write_text(json.dumps(meta))
    return path


def run_cli(argv, capsys):
    code = cli.main(["compare", *(str(a) for a in argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _traced_run(root: Path, name: str) -> Path:
    """`make_run`'s run directory with `marker_trace`'s trace in it."""
    from marker_traces import marker_trace

    run = make_run(root, name)
    marker_trace(run / "plugins" / "profile" / "s" / "host.xplane.pb")
    return run
