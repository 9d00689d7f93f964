"""What `devprof run --onednn-kernels` adds to a step: the seed CNN on this CPU, with and without.

oneDNN reads ONEDNN_VERBOSE once, when it loads, so each run is its own process: the same
`devprof run` (synthetic data, one epoch, batch 64, a 5-step window, no samplers) with and without
the flag, in turns (with first in even rounds, without first in odd ones), so that both see the
same machine. Each run's steady steps (steps.csv, after the first 3) give its median step; the
medians of the runs are compared, and the log's lines and bytes per step are printed.

    .venv/bin/python bench/bench_onednn_kernels.py [--rounds 3] [--images 1920] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def one_run(out: Path, name: str, images: int, flag: bool) -> tuple[float, dict | None, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_VERBOSE", "ONEDNN_VERBOSE_TIMESTAMP")}
    env.update(TF_ENABLE_ONEDNN_OPTS="1", CUDA_VISIBLE_DEVICES="")
    argv = [
        sys.executable,
        "-m",
        "profiler",
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--out",
        str(out),
        "--run-name",
        name,
        "--quiet",
        "--epochs",
        "1",
        "--limit-images",
        str(images),
        "--batch-size",
        "64",
        "--no-sample",
        "--profile-steps",
        "5:10",
        "--limit-test-images",
        "64",
    ]
    done = subprocess.run(
        argv + (["--onednn-kernels"] if flag else []), env=env, cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"devprof run failed ({done.returncode}): {done.stderr[-1000:]}")
    steps = pd.read_csv(out / name / "steps.csv")
    steady = steps[steps["step"] >= 3]
    notes = json.loads((out / name / "run.json").read_text())["profiler"].get("onednn_verbose")
    return float(steady["step_ms"].median()), notes, len(steps)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=1920, help="training images (batch 64: images/64 steps)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="devprof-bench-onednn-"))
    with_flag: list[float] = []
    without: list[float] = []
    for index in range(args.rounds):
        for flag in (True, False) if index % 2 == 0 else (False, True):
            step_ms, notes, steps = one_run(out, f"{'with' if flag else 'without'}-{index}", args.images, flag)
            (with_flag if flag else without).append(step_ms)
            kept = (
                f", log {notes['lines']} lines, {notes['bytes'] / 1e3:.0f} kB kept, {notes['dropped_lines']} "
                f"dropped ({steps} steps)"
                if notes
                else ""
            )
            print(
                f"round {index} {'with   ' if flag else 'without'} --onednn-kernels: median step "
                f"{step_ms:7.1f} ms{kept}",
                flush=True,
            )
    w, wo = statistics.median(with_flag), statistics.median(without)
    print(f"median step: with {w:.1f} ms, without {wo:.1f} ms, ratio {w / wo:.3f}")


if __name__ == "__main__":
    main()
