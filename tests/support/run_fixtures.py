"""Run directories made from steps.csv lines (`make_run(path, [step_line(i) ...])`), as `devprof run` writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.read.run_files import STEPS_COLUMNS

HEADER = ",".join(STEPS_COLUMNS)


def step_line(step, input_ms=1.0, call_ms=8.0, other_ms=1.0, epoch=1):
    return (
        f"{epoch},{step},1,{1_700_000_000 + step * 0.01:.6f},{input_ms},{call_ms},{other_ms},"
        f"{input_ms + call_ms + other_ms},100"
    )


def make_run(path, steps_lines, *, epochs=None, host_rows=None, summaries=None):
    path.mkdir(parents=True)
    (path / "steps.csv").write_text("\n".join([HEADER, *steps_lines]) + "\n")
    meta = {
        "status": "complete",
        "config": {"batch_size": 100, "precision": "float32"},
        "device": {"kind": "cpu", "name": "Test CPU"},
        "steps_per_epoch": len(steps_lines),
        "epochs": epochs if epochs is not None else [{"epoch": 1, "seconds": 0.2, "images": 100 * len(steps_lines)}],
        "samplers": {"summaries": summaries or {}},
    }
    (path / "run.json").write_text(json.dumps(meta))
    if host_rows is not None:
        (path / "utilization").mkdir()
        pd.DataFrame(host_rows, columns=["time_s", "cpu_pct", "proc_cpu_pct", "proc_rss_bytes"]).to_csv(
            path / "utilization" / "host.csv", index=False
        )
    return path


def small_run(path: Path, steps: int = 6, **options) -> Path:
    return make_run(path, [step_line(i) for i in range(steps)], **options)


def edit_run_json(run: Path, change) -> Path:
    meta = json.loads((run / "run.json").read_text())
    change(meta)
    (run / "run.json").write_text(json.dumps(meta))
    return run
