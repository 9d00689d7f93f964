"""A job of N workers analysed by the local process pool and by a Dask cluster on loopback, side by side.

    .venv/bin/python bench/bench_cluster.py [--sizes 16,64,256] [--steps 750] [--no-xprof]

Writes one job folder of max(--sizes) synthetic workers (each a run directory with a one-GPU trace
of --steps steps, about 20 events each: 750 steps is about the 0.5 MB a real worker writes for
10 traced steps), two of them stragglers of known cause (worker 5: 6 ms more host work per step,
worker 11: 3 ms more input), and jobs of the first N workers beside it (hard links). Then, for
each N, `analysis.analyze(job, processes=2)` (the local pool) and `analysis.analyze(job,
executor=...)` on a Dask scheduler and two worker processes (one thread each) started on
127.0.0.1, each in a fresh client process whose peak RSS is measured (ru_maxrss), and XProf's
converter over the same N files one after another (trace_viewer, which converts every event, and
input_pipeline_analyzer). It checks that both
outputs are identical and that they name worker 5 (host) as the straggler and 11 (input) next.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLIENT = """
import json, resource, sys, time
sys.path[:0] = [sys.argv[1]]
from analysis import pipeline, executors
job, mode, address = sys.argv[2], sys.argv[3], sys.argv[4]
start = time.perf_counter()
if mode == "dask":
    with executors.dask_executor(address) as executor:
        result = pipeline.analyze(job, executor=executor)
else:
    result = pipeline.analyze(job, processes=2)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "doc": result.to_json()}))
"""
XPROF = """
import sys, time
from xprof.convert import raw_to_tool_data
start = time.perf_counter()
for path in sys.argv[2:]:
    raw_to_tool_data.xspace_to_tool_data([path], sys.argv[1], {"use_saved_result": False})
print(time.perf_counter() - start)
"""
# trace_viewer converts every event (to its JSON trace); input_pipeline_analyzer is the step breakdown
XPROF_TOOLS = ("trace_viewer", "input_pipeline_analyzer")


def _subset(source: Path, target: Path, count: int) -> Path:
    target.mkdir()
    for i in range(count):
        shutil.copytree(source / f"worker-{i}", target / f"worker-{i}", copy_function=os.link)
    meta = {"status": "complete", "num_workers": count, "workers": [f"worker-{i}" for i in range(count)]}
    (target / "run.json").write_text(json.dumps(meta))
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,64,256")
    parser.add_argument("--steps", type=int, default=750)
    parser.add_argument("--no-xprof", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]
    from analysis.read.trace import read_trace
    from cluster_fixtures import DaskCluster, write_job

    folder = Path(tempfile.mkdtemp(prefix="devprof-cluster-"))
    full = write_job(folder, workers=max(sizes), steps=args.steps, name=f"job{max(sizes)}").path
    traces = {i: next((full / f"worker-{i}").rglob("*.xplane.pb")) for i in range(max(sizes))}
    events = len(read_trace(traces[0]).events)
    size = traces[0].stat().st_size
    print(f"{max(sizes)} workers, {events:,} events and {size / 2**20:.2f} MiB per worker trace", file=sys.stderr)
    cluster = DaskCluster(folder)
    ok = True
    try:
        print(
            "| N | events | local pool s | Dask s | XProf trace_viewer s | XProf input_pipeline s | local events/s | "
            "Dask events/s | XProf trace_viewer events/s | client peak MiB local / Dask | identical | "
            "straggler, next |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in sizes:
            job = full if n == max(sizes) else _subset(full, folder / f"job{n}", n)
            runs = {}
            for mode in ("local", "dask"):
                out = subprocess.run(
                    [sys.executable, "-c", CLIENT, str(REPO), str(job), mode, cluster.address],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[mode] = json.loads(out.stdout)
            xprof = {tool: float("nan") for tool in XPROF_TOOLS}
            for tool in () if args.no_xprof else XPROF_TOOLS:
                out = subprocess.run(
                    [sys.executable, "-c", XPROF, tool, *(str(traces[i]) for i in range(n))],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                xprof[tool] = float(out.stdout.strip().splitlines()[-1])
            doc = runs["dask"]["doc"]
            same = runs["local"]["doc"] == doc
            found = (doc["straggler"] or {}).get("worker"), (doc["straggler"] or {}).get("cause")
            second = doc["slowest_workers"][1]["worker"], doc["slowest_workers"][1]["cause"]
            ok &= same and found == (5, "host") and second == (11, "input")
            total = n * events
            viewer = xprof["trace_viewer"]
            print(
                f"| {n} | {total:,} | {runs['local']['seconds']:.1f} | {runs['dask']['seconds']:.1f} | "
                f"{viewer:.1f} | {xprof['input_pipeline_analyzer']:.1f} | {total / runs['local']['seconds']:,.0f} | "
                f"{total / runs['dask']['seconds']:,.0f} | {total / viewer:,.0f} | {runs['local']['peak_mib']:.0f} / "
                f"{runs['dask']['peak_mib']:.0f} | {same} | {found[0]} {found[1]}, {second[0]} {second[1]} |",
                flush=True,
            )
    finally:
        cluster.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
