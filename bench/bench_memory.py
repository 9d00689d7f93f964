"""The memory table's cost in `devprof analyze`, and its peaks against XProf's Memory Profile tool.

1. Makes (once; cached under --cache) a CPU run with a long profiler window (`devprof run --device cpu
   --data synthetic --batch-size 32 --epochs 1 --profile-steps A:B --host-tracer-level 2 --no-sample`),
   or takes --run; counts its events and its allocator events.
2. Times, each in a fresh subprocess, alternating (the order rotates every repeat) and repeated:
   - `analyze`: `analysis.analyze(RUN)` with this tree (the memory table read and broken down),
   - `baseline`: the same with the tree at --baseline REV (a `git archive` copy; default: the commit
     before the allocator events were read),
   - `memory`: the memory table alone, after reading: `TraceView.memory` and `memory_report`,
   - `xprof`: XProf's `xspace_to_tool_data([XPLANE], "memory_profile", ...)`.
   Wall time of the work (after imports) and the child's peak RSS (`os.wait4`).
3. Per allocator, devprof's peak bytes in use against XProf's, on that trace and on every --oracle
   trace (e.g. ../shared/traces/tf-gpu-keras-vae-gtx1060): equal to the byte, or the script says not.

    python bench/bench_memory.py [--cache /tmp/devprof-bench-memory] [--profile-steps 10:1010] [--repeats 3]
        [--baseline REV] [--oracle TRACE ...]
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


def child(task: str, run: str) -> None:
    """One task in this fresh process; prints `{"work_s": ...}` last."""
    if task == "xprof":
        from xprof.convert import raw_to_tool_data

        from analysis.read.trace import locate_trace

        xplane = str(locate_trace(run).xplane)
        start = time.perf_counter()
        raw_to_tool_data.xspace_to_tool_data([xplane], "memory_profile", {})
    elif task == "memory":
        from analysis.breakdown.memory import memory_report
        from analysis.read.inputs import read_inputs
        from analysis.steps.sources import find_steps

        inputs = read_inputs(run)
        steps = find_steps(inputs, None).steps
        start = time.perf_counter()
        memory_report(inputs, steps)
    else:
        from analysis import analyze

        start = time.perf_counter()
        analyze(run)
    print(json.dumps({"work_s": time.perf_counter() - start}))


def measure(command: list[str], tree: Path) -> dict:
    """One fresh subprocess importing `tree`: its wall time, its own peak RSS and its work time."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=tree, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0), err.seek(0)
        printed, errors = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{errors[-3000:]}")
    result = {"wall_s": wall, "peak_mib": usage.ru_maxrss / 1024}
    result.update(json.loads(printed.strip().splitlines()[-1]))
    return result


def make_run(cache: Path, profile_steps: str) -> Path:
    first, last = (int(v) for v in profile_steps.split(":"))
    run = cache / f"cpu-{first}-{last}"
    if (run / "run.json").is_file():
        return run
    cache.mkdir(parents=True, exist_ok=True)
    images = (last + 20) * 32
    command = [
        sys.executable,
        "-c",
        "import sys; from profiler.cli import main; sys.exit(main())",
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--batch-size",
        "32",
        "--epochs",
        "1",
        "--limit-images",
        str(images),
        "--limit-test-images",
        "64",
        "--profile-steps",
        profile_steps,
        "--host-tracer-level",
        "2",
        "--no-sample",
        "--out",
        str(cache),
        "--run-name",
        run.name,
        "--quiet",
    ]
    subprocess.run(command, cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return run


def baseline_tree(revision: str) -> Path:
    target = Path(tempfile.mkdtemp(prefix="devprof-bench-memory-"))
    archive = subprocess.run(["git", "archive", revision], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    # this script's child, run from the copy, imports the copy's analysis/
    (target / "bench").mkdir(exist_ok=True)
    (target / "bench" / "bench_memory.py").write_text(Path(__file__).read_text())
    return target


def peaks(trace: str) -> tuple[dict, dict, int]:
    """(devprof's peak per allocator, XProf's, allocator events) for one trace."""
    from xprof.convert import raw_to_tool_data

    from analysis.breakdown.memory_allocators import allocator_report
    from analysis.read.trace import locate_trace, read_trace
    from analysis.read.view import TraceView

    xplane = locate_trace(trace).xplane
    view = TraceView(read_trace(xplane))
    import pandas as pd

    mine, _, _ = allocator_report(view.memory, pd.DataFrame(columns=["step", "start_ns", "end_ns"]), view.window[0])
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)], "memory_profile", {})
    document = json.loads(data.decode() if isinstance(data, bytes) else data)
    theirs = {
        name: int(p["profileSummary"]["peakStats"]["peakBytesInUse"])
        for name, p in document.get("memoryProfilePerAllocator", {}).items()
    }
    return {p.name: p.peak_bytes for p in mine}, theirs, len(view.memory)


def _bytes(value) -> str:
    return f"{value:,}" if value is not None else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/devprof-bench-memory"))
    parser.add_argument("--profile-steps", default="10:1010")
    parser.add_argument("--run", help="an existing run directory or trace instead of making one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="b5f12d5^", help="the tree before the allocator events were read")
    parser.add_argument("--oracle", nargs="*", default=[], help="more traces whose peaks to check against XProf")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    run = Path(args.run) if args.run else make_run(args.cache, args.profile_steps)
    from analysis.read.trace import read_trace

    events = len(read_trace(run).events)
    base = baseline_tree(args.baseline)
    tasks = {"analyze": REPO, "baseline": base, "memory": REPO, "xprof": REPO}
    results: dict[str, list[dict]] = {task: [] for task in tasks}
    for repeat in range(args.repeats):
        order = list(tasks)[repeat % len(tasks) :] + list(tasks)[: repeat % len(tasks)]
        for task in order:
            command = [
                sys.executable,
                str(tasks[task] / "bench" / "bench_memory.py"),
                "--child",
                "analyze" if task == "baseline" else task,
                str(run.resolve()),
            ]
            results[task].append(measure(command, tasks[task]))
    mine, theirs, allocator_events = peaks(str(run))
    print(f"    {shlex.join([sys.executable, *sys.argv])}\n")
    print(f"{events:,} events, {allocator_events:,} of them allocator events; {args.repeats} repeats, alternated\n")
    print("| task | work s (median) | range | peak RSS MiB (median) |\n|---|---:|---:|---:|")
    for task, rows in results.items():
        work = [r["work_s"] for r in rows]
        print(
            f"| {task} | {statistics.median(work):.2f} | {min(work):.2f}–{max(work):.2f} | "
            f"{statistics.median(r['peak_mib'] for r in rows):.0f} |"
        )
    print("\n| trace | allocator | devprof peak bytes | XProf peak bytes | equal |\n|---|---|---:|---:|---|")
    for trace in [str(run), *args.oracle]:
        ours, xprof, _ = (mine, theirs, 0) if trace == str(run) else peaks(trace)
        for name in sorted(set(ours) | set(xprof)):
            print(
                f"| {Path(trace).name} | {name} | {_bytes(ours.get(name))} | {_bytes(xprof.get(name))} | "
                f"{'yes' if ours.get(name) == xprof.get(name) else '**no**'} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
