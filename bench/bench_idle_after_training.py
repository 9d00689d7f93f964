"""The silent stretch between a run's last epoch and its test pass, from the run's own samples.

    .venv/bin/python bench/bench_idle_after_training.py --old /tmp/old --rounds 1 -- \
        --limit-images 10000 --epochs 2

Runs `devprof run --device cpu --data synthetic --no-profile ARGS` from this checkout and, with
`--old PATH`, from another checkout (an older commit) beside it, alternated. For each run: the
longest stretch at under 5 % process CPU in `utilization/host.csv` from the last epoch's end to
the last sample (the test pass and the run's finish), and the seconds from the run's last line
to the process's exit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
IDLE_PCT = 5.0


def longest_idle(run: Path) -> tuple[float, float]:
    """(seconds, start after the last epoch's end) of the longest stretch under IDLE_PCT process CPU."""
    meta = json.loads((run / "run.json").read_text())
    last = meta["epochs"][-1]
    end = last["start_time_s"] + last["seconds"]
    host = pd.read_csv(run / "utilization" / "host.csv").sort_values("time_s")
    after = host[host["time_s"] >= end]
    best, where, began, previous = 0.0, float("nan"), None, end
    for t, pct in zip(after["time_s"], after["proc_cpu_pct"]):
        if pct < IDLE_PCT:
            began = previous if began is None else began  # the stretch began at the last busy sample
            if t - began > best:
                best, where = t - began, began - end
        else:
            began = None
        previous = t
    return best, where


def one_run(checkout: Path, out: Path, name: str, args: list[str]) -> dict:
    command = [
        sys.executable,
        "-m",
        "profiler",
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--no-profile",
        "--out",
        str(out),
        "--run-name",
        name,
        *args,
    ]
    began = time.perf_counter()
    process = subprocess.Popen(command, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    last_line = began
    assert process.stdout is not None  # stdout=PIPE
    for line in process.stdout:
        last_line = time.perf_counter()
    code = process.wait()
    idle, where = longest_idle(out / name)
    return {
        "run": name,
        "code": code,
        "idle_s": idle,
        "idle_at_s": where,
        "exit_after_last_line_s": time.perf_counter() - last_line,
        "wall_s": time.perf_counter() - began,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="another checkout to run beside this one")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("args", nargs="*", help="devprof run options (after --)")
    options = parser.parse_args(argv)
    checkouts = ([("old", options.old)] if options.old else []) + [("new", REPO)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(1, options.rounds + 1):
            for label, checkout in checkouts:
                row = one_run(checkout, Path(folder), f"{label}{round_}", options.args)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{' '.join(sys.argv)}\n")
    print("| run | exit code | longest stretch < 5 % CPU after the last epoch | where | exit after the last line |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        where = f"{row['idle_at_s']:.1f} s after it" if row["idle_s"] > 0 else "none"
        print(
            f"| {row['run']} | {row['code']} | {row['idle_s']:.1f} s | {where} | {row['exit_after_last_line_s']:.1f} s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
