"""devprof's trace analysis vs XProf's overview_page conversion, on the same trace.

Makes a 100-step trace of a small CNN custom loop (real TensorFlow, CPU), then times,
alternating and repeated, (a) `analysis.analyze` (read + steps + verdict) and
(b) `xprof.convert.raw_to_tool_data.xspace_to_tool_data([...], "overview_page")`.
Prints per-repeat times, medians and the ratio. Usage:

    python bench/bench_analysis.py [--steps 100] [--repeats 5] [--trace PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))


def make_trace(steps: int, logdir: Path) -> Path:
    import trace_fixtures

    trace_fixtures.make_custom_loop_trace(logdir, steps=steps)
    return trace_fixtures.find_xplane(logdir)


def time_devprof(xplane: Path) -> float:
    from analysis import analyze

    start = time.perf_counter()
    analyze(xplane)
    return time.perf_counter() - start


def time_xprof(xplane: Path) -> float:
    from xprof.convert import raw_to_tool_data

    start = time.perf_counter()
    raw_to_tool_data.xspace_to_tool_data([str(xplane)], "overview_page", {"use_saved_result": False})
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trace", type=Path, default=None, help="use this .xplane.pb instead of making one")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="devprof-bench-") as tmp:
        xplane = args.trace or make_trace(args.steps, Path(tmp) / "logs")
        size_mb = xplane.stat().st_size / 1e6
        time_devprof(xplane), time_xprof(xplane)  # warm imports and caches
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(time_devprof(xplane))
            theirs.append(time_xprof(xplane))
        print(f"trace: {xplane.name}, {size_mb:.2f} MB, {args.steps} steps")
        print("repeat  devprof_s  xprof_overview_s")
        for i, (a, b) in enumerate(zip(ours, theirs), 1):
            print(f"{i:6d}  {a:9.4f}  {b:16.4f}")
        median_ours, median_theirs = statistics.median(ours), statistics.median(theirs)
        print(f"median  {median_ours:9.4f}  {median_theirs:16.4f}")
        print(f"ratio devprof / xprof (median): {median_ours / median_theirs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
