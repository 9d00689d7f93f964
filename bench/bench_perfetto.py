"""The Perfetto export's speed and memory on a large synthetic trace: events written per second.

1. Makes (once; cached under --cache) a synthetic CPU+GPU trace of about --events events: a host plane
   with `train` step markers, the iterator's wait and, on four executor threads, TensorFlow op events
   ("scope/op:Type", nested in `ExecutorState::Process`); a GPU plane with one kernel per op on a
   compute stream; and the allocators' events. Written straight as an XSpace (no TensorFlow run).
2. Each in a fresh subprocess, alternating and repeated: `analyze` (`analysis.analyze`, the baseline);
   `command-<ops|all|none>`: as `devprof analyze --perfetto FILE --perfetto-events <...>` does, the analysis
   keeping its read of the trace (`pipeline.analyze_and_read`), then the export from it; `export-<...>`: as
   `Analysis.to_perfetto` does, the analysis, then the export reading the trace again. For each export,
   the time of the export alone (after the analysis), the events written (slices, instants and counter
   values) and their rate, the file's size, and the process's peak RSS beside the analysis' own.
   With --path, a run or trace of one's own instead of the synthetic one (bench_memory.py's cached
   2M-event CPU run, say).

Prints Markdown tables of medians and the command that made them:

    python bench/bench_perfetto.py [--events 2000000] [--repeats 3] [--cache /tmp/devprof-bench-perfetto] [--path RUN]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "support"))

MIB = 1024 * 1024
BASE_NS = 1_800_000_000_000_000_000
OPS_PER_STEP = 100
THREADS = 4


def make_trace(path: Path, events: int) -> Path:
    """A synthetic trace of about `events` events (see the module's docstring)."""
    from xplane_message import _xplane_module

    per_step = 2 + THREADS + 2 * OPS_PER_STEP + 2
    steps = max(2, events // per_step)
    space = _xplane_module().XSpace()
    space.hostnames.append("bench-host")
    host = space.planes.add(id=1, name="/host:CPU")
    gpu = space.planes.add(id=2, name="/device:GPU:0")
    names: dict[tuple[int, str], int] = {}

    def meta(plane, name: str) -> int:
        key = (plane.id, name)
        if key not in names:
            names[key] = len(names) + 1
            plane.event_metadata[names[key]].id = names[key]
            plane.event_metadata[names[key]].name = name
        return names[key]

    for plane, stat_id, stat in (
        (host, 1, "step_num"),
        (host, 2, "_r"),
        (host, 3, "bytes_allocated"),
        (host, 4, "allocator_name"),
        (gpu, 1, "tf_op"),
    ):
        plane.stat_metadata[stat_id].id = stat_id
        plane.stat_metadata[stat_id].name = stat
    python = host.lines.add(id=1, name="python", display_name="python", timestamp_ns=BASE_NS)
    threads = [
        host.lines.add(id=10 + t, name=f"tf_Compute/{t}", display_name=f"tf_Compute/{t}", timestamp_ns=BASE_NS)
        for t in range(THREADS)
    ]
    stream = gpu.lines.add(id=13, name="Stream #13(Compute)", display_name="Stream #13(Compute)", timestamp_ns=BASE_NS)
    train, get_next, process = meta(host, "train"), meta(host, "IteratorGetNext"), meta(host, "ExecutorState::Process")
    allocation = meta(host, "MemoryAllocation")
    ops = [
        meta(host, f"model/layer{i}/op{i}:{('Conv2D', 'MatMul', 'Relu', 'BiasAdd')[i % 4]}")
        for i in range(OPS_PER_STEP)
    ]
    kernels = [meta(gpu, f"kernel_{i % 20}") for i in range(OPS_PER_STEP)]
    step_ps, op_ps = 10_000_000_000, 60_000_000  # 10 ms steps, 60 us ops
    for k in range(steps):
        t = k * step_ps
        marker = python.events.add(metadata_id=train, offset_ps=t, duration_ps=step_ps)
        marker.stats.add(metadata_id=1, int64_value=k)
        marker.stats.add(metadata_id=2, int64_value=1)
        python.events.add(metadata_id=get_next, offset_ps=t, duration_ps=1_000_000_000)
        begin = t + 1_000_000_000
        per_thread = OPS_PER_STEP // THREADS
        for j, line in enumerate(threads):
            line.events.add(metadata_id=process, offset_ps=begin, duration_ps=per_thread * op_ps)
            for i in range(per_thread):
                line.events.add(
                    metadata_id=ops[j * per_thread + i], offset_ps=begin + i * op_ps, duration_ps=op_ps - 1000
                )
        for i in range(OPS_PER_STEP):
            stream.events.add(metadata_id=kernels[i], offset_ps=begin + i * op_ps // 2, duration_ps=op_ps // 3)
        for a in range(2):
            event = python.events.add(metadata_id=allocation, offset_ps=t + 1_000_000_000 + a, duration_ps=0)
            event.stats.add(metadata_id=3, int64_value=(k % 50 + a) * 1_000_000)
            event.stats.add(metadata_id=4, str_value="GPU_0_bfc")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())
    return path


# ---------------------------------------------------------------- children (one task each)


def child(task: str, trace: str) -> None:
    import resource

    import analysis
    from analysis import pipeline, worker

    out: dict = {"task": task}
    kept = None
    if task.startswith("command-"):  # as `devprof analyze --perfetto` does: the analysis' read kept for the export
        result, kept = pipeline.analyze_and_read(trace)
    else:
        result = analysis.analyze(trace, processes=1)
    out["steps"] = int(len(result.steps))
    if task != "analyze":
        target = Path(tempfile.mkdtemp()) / "trace.pftrace"
        start = time.perf_counter()
        written = worker.write_perfetto(result, target, task.split("-", 1)[1], inputs=kept)
        out.update(
            seconds=time.perf_counter() - start,
            events=written.events,
            slices=written.slices,
            counter_values=written.counter_values,
            bytes=target.stat().st_size,
        )
        target.unlink()
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def measure(task: str, trace: Path) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", task, str(trace)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "devprof-bench-perfetto")
    parser.add_argument(
        "--path",
        type=Path,
        default=None,
        help="measure this run or trace instead of the synthetic one (e.g. bench_memory.py's cached run)",
    )
    parser.add_argument("--child", nargs=2, metavar=("TASK", "TRACE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    trace = args.cache / f"events-{args.events}" / "plugins" / "profile" / "bench" / "bench-host.xplane.pb"
    if args.path is not None:
        trace = args.path
    elif not trace.is_file():
        start = time.perf_counter()
        make_trace(trace, args.events)
        print(f"made {trace} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    from analysis.read.trace import locate_trace, read_trace

    total = len(read_trace(trace).events)
    size = locate_trace(trace).xplane.stat().st_size
    tasks = ["analyze", "command-ops", "command-all", "command-none", "export-ops", "export-all", "export-none"]
    results: dict[str, list[dict]] = {task: [] for task in tasks}
    for repeat in range(args.repeats):
        for task in tasks[repeat % len(tasks) :] + tasks[: repeat % len(tasks)]:
            results[task].append(measure(task, trace))
    baseline = statistics.median(r["peak_rss_mib"] for r in results["analyze"])
    print(
        f"\nTrace: {trace}, {total:,} events ({size / MIB:.0f} MiB), "
        f"{results['analyze'][0]['steps']:,} steps; medians of {args.repeats}.\n"
    )
    print(f"| task | events written | seconds | events/s | file MiB | peak RSS MiB (analysis alone: {baseline:.0f}) |")
    print("|---|---:|---:|---:|---:|---:|")
    for task in tasks[1:]:
        rows = results[task]
        seconds = statistics.median(r["seconds"] for r in rows)
        events = rows[0]["events"]
        print(
            f"| {task} | {events:,} | {seconds:.2f} | {events / seconds:,.0f} | {rows[0]['bytes'] / MIB:.0f} | "
            f"{statistics.median(r['peak_rss_mib'] for r in rows):.0f} |"
        )
    print(f"\n    python {shlex.join(['bench/bench_perfetto.py', *(argv if argv is not None else sys.argv[1:])])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
