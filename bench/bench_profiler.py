"""Profiler overhead: the same training steps with and without the TF profiler window.

Alternates `devprof run` subprocesses with `--profile-steps START:STOP` and with `--no-profile`
(same seed, data and steps), `--reps` times each, so drift in machine speed hits both sides
alike. For each run it takes the mean `step_ms` of the window's steps from steps.csv (the
same steps on both sides), and from run.json the profiler's start and stop (trace flush)
times, which happen between steps and are therefore not in any step's time.

Prints markdown tables for BENCHMARKS.md and the exact command. Run on a quiet machine:

    python bench/bench_profiler.py            # full: 5 reps per side, ~5 min on 2 CPU cores
    python bench/bench_profiler.py --quick    # smoke run: 1 rep per side, a short window
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(out: Path, name: str, args, profile: bool) -> dict:
    start, stop = args.window
    command = [
        sys.executable,
        "-m",
        "profiler",
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--limit-images",
        str(args.images),
        "--epochs",
        "1",
        "--no-sample",
        "--quiet",
        "--out",
        str(out),
        "--run-name",
        name,
    ]
    command += ["--profile-steps", f"{start}:{stop}"] if profile else ["--no-profile"]
    if args.python_tracer and profile:
        command.append("--python-tracer")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"devprof run failed ({done.returncode}): {done.stderr[-2000:]}")
    with open(out / name / "steps.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if start <= int(r["step"]) < stop]
    if len(rows) != stop - start:
        raise SystemExit(f"expected steps {start}..{stop - 1} in {out / name / 'steps.csv'}, found {len(rows)}")
    prof = json.loads((out / name / "run.json").read_text())["profiler"]
    return {
        "step_ms": statistics.fmean(float(r["step_ms"]) for r in rows),
        "start_ms": prof.get("start_ms"),
        "stop_ms": prof.get("stop_ms"),
        "trace_events": prof.get("trace_events"),
        "trace_bytes": prof.get("trace_bytes"),
        "warnings": prof.get("warnings", []),
        "command": command,
        "out": str(out),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="runs per side (with / without the window)")
    parser.add_argument("--images", type=int, default=3000, help="--limit-images (3000 = 30 steps)")
    parser.add_argument("--window", default="5:25", help="profiled steps START:STOP, compared on both sides")
    parser.add_argument("--python-tracer", action="store_true", help="profile with --python-tracer")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 rep, 1000 images, window 3:8")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.images, args.window = 1, 1000, "3:8"
    args.window = tuple(int(x) for x in args.window.split(":"))

    results: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for profile in (True, False) if rep % 2 == 0 else (False, True):
                name = f"{'on' if profile else 'off'}-{rep}"
                results[profile].append(run_once(Path(tmp), name, args, profile))
                print(f"  {name}: {results[profile][-1]['step_ms']:.1f} ms/step", file=sys.stderr, flush=True)

    start, stop = args.window
    on = [r["step_ms"] for r in results[True]]
    off = [r["step_ms"] for r in results[False]]
    print(f"## Profiler overhead ({os.cpu_count()} CPU cores, seed CNN, batch 100, CPU)")
    print()
    print(f"Mean step time of steps {start}..{stop - 1} (the profiled window), {args.reps} runs per side, alternated.")
    print()
    print("| | mean ms/step | min | max |")
    print("|---|---:|---:|---:|")
    for label, times in (("profiled window", on), ("--no-profile", off)):
        print(f"| {label} | {statistics.fmean(times):.1f} | {min(times):.1f} | {max(times):.1f} |")
    print()
    print(f"**profiled / not profiled = {statistics.fmean(on) / statistics.fmean(off):.3f}** (1.000 = no overhead)")
    print()
    starts = [r["start_ms"] for r in results[True] if r["start_ms"] is not None]
    stops = [r["stop_ms"] for r in results[True] if r["stop_ms"] is not None]
    events = [r["trace_events"] for r in results[True] if r["trace_events"]]
    print("| profiler (outside the steps) | mean | max |")
    print("|---|---:|---:|")
    if starts:
        print(f"| start ms | {statistics.fmean(starts):.1f} | {max(starts):.1f} |")
    if stops:
        print(f"| stop + write trace ms | {statistics.fmean(stops):.1f} | {max(stops):.1f} |")
    if events:
        print(
            f"| trace events per step | {statistics.fmean(events) / (stop - start):.0f} | "
            f"{max(events) / (stop - start):.0f} |"
        )
    warnings = sorted({w for r in results[True] for w in r["warnings"]})
    if warnings:
        print()
        print("Profiler warnings: " + "; ".join(warnings))
    print()
    print("Command (this script; one of its runs):")
    print()
    print(f"    python bench/bench_profiler.py {' '.join(shlex.quote(a) for a in (argv or sys.argv[1:]))}".rstrip())
    shown = ["OUT" if a == results[True][0]["out"] else a for a in results[True][0]["command"][3:]]
    print(f"    {shlex.join(['devprof', *shown])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
