"""A job's worker traces analysed at once (process pool) beside one after another.

    .venv/bin/python bench/bench_parallel_workers.py [--workers 4] [--steps 30000] [--repeats 3]

Writes a session of `--workers` synthetic GPU worker traces (one host file each, every step
about 20 events), then times `analysis.analyze(session)` with `processes=1` and with the
default pool, alternated, each in a fresh process, and checks the two results are equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = """
import json, sys, time
sys.path[:0] = [sys.argv[1]]
from analysis import pipeline
start = time.perf_counter()
result = pipeline.analyze(sys.argv[2], processes=None if sys.argv[3] == "pool" else 1)
print(json.dumps({"seconds": time.perf_counter() - start, "doc": result.to_json()}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]
    import trace_fixtures as fx
    from analysis.read.trace import read_trace

    folder = Path(tempfile.mkdtemp(prefix="devprof-parallel-"))
    made = fx.write_synthetic_session(folder, workers=args.workers, steps=args.steps)
    events = len(read_trace(made.files[0]).events)
    print(
        f"{args.workers} worker traces of {events:,} events each ({made.files[0].stat().st_size / 2**20:.0f} MiB)",
        file=sys.stderr,
    )
    times: dict[str, list[float]] = {"sequential": [], "pool": []}
    docs = {}
    for _ in range(args.repeats):
        for mode in ("sequential", "pool"):
            out = subprocess.run(
                [sys.executable, "-c", RUN, str(REPO), str(folder), mode], capture_output=True, text=True, check=True
            )
            result = json.loads(out.stdout)
            times[mode].append(result["seconds"])
            docs[mode] = result["doc"]
    same = docs["sequential"] == docs["pool"]
    seq, pool = statistics.median(times["sequential"]), statistics.median(times["pool"])
    print(
        f"events per worker: {events}; sequential {seq:.1f} s, pool {pool:.1f} s (median of {args.repeats}); "
        f"ratio {pool / seq:.2f}; identical results: {same}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
