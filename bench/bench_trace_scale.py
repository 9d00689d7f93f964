"""devprof on a trace past the trace viewer's 1M events: read + analysis, plots, the whole
`devprof analyze` command and XProf's own converter, side by side.

1. Makes (once; cached under --cache) a run with a long profiler window: `devprof run --device
   cpu --data synthetic --batch-size 32 --epochs 1 --profile-steps 10:1010 --host-tracer-level 2
   --no-sample`, about 2.3 million events, and counts its events with `analysis.trace.read_trace`.
2. Times, each in a fresh subprocess, alternating (the order rotates every repeat) and repeated:
   - `analyze`: `analysis.analyze(RUN)` (read the trace, find steps, break down, verdict;
     no plots),
   - `plots`: the plots `devprof analyze` draws (`plot_step_breakdown`, `plot_epoch_breakdown`) on
     the analysed steps, read from CSV,
   - `command`: the whole `devprof analyze RUN --out DIR` (stdout discarded; its PNGs drawn by the plot
     helper process, analysis/parallel/plots.py); `command-one-process` with DEVPROF_FORK=0 (no forked
     child: no plot helper, no child decoding part of the events or analysing the tf.data stages); `command-baseline` the command of a
     `git archive` of --command-baseline REV,
   - `xprof`: `xprof.convert.raw_to_tool_data.xspace_to_tool_data([XPLANE],
     "input_pipeline_analyzer", {"use_saved_result": False})`, XProf's step breakdown.
   Wall time of the work itself (after imports), of the whole process, its CPU time, and the process's
   peak RSS (`os.wait4`'s `ru_maxrss` of that one child: with the plot helper, the larger of the two
   processes' peaks; the helper's own peak and private memory are measured apart, once per size).
3. Times plotting alone at 100, 800, 1,000 and 3,000 synthetic steps and on a 50,000-row sampler
   CSV, in one process, alternating with an older `analysis/plots.py` when --plots-baseline REV is
   given.
4. With --scale 60,120,240,480,1000: the tasks on traces of several sizes (profiler windows of that
   many steps, one cached run each), sizes and tasks alternated, with tables per size, ratios to
   XProf, a linear fit and log-log slope per task, and with --plot PNG the two curves.
5. With --stages: time and RSS after each stage of `read_trace`, then of the whole `analyze`; with
   --cprofile: cProfile of `analyze`, the functions with the most own and cumulative time.
6. With --scale and --startup N: the start-up on its own: `devprof --help` and `devprof analyze --help`
   (best of N), and the command's import tree (`python -X importtime`) by package, now and at
   --command-baseline.

Prints Markdown tables of medians and ratios, and the command that made them:

    python bench/bench_trace_scale.py [--cache /tmp/devprof-bench-trace-scale] [--repeats 5]
        [--profile-steps 10:1010] [--host-tracer-level 2] [--plots-baseline REV] [--trace-baseline REV]
        [--stages] [--cprofile] [--scale STEPS,... --plot PNG --results JSONL --command-baseline REV --startup N]

Children import the tree this script sits in (PYTHONPATH), so a copy of the repository at one
commit (`git archive`) measures that commit while the checkout changes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASKS = ("analyze", "plots", "command", "xprof")
TASK_LABELS = {
    "analyze": "devprof read + analysis (`analysis.analyze`, no plots)",
    "analyze-baseline": "devprof read + analysis, `analysis/trace.py` of --trace-baseline",
    "plots": "devprof plots alone (step and epoch breakdown PNGs)",
    "command": "whole `devprof analyze RUN --out DIR`",
    "command-one-process": "the same, all in one process (`DEVPROF_FORK=0`)",
    "command-baseline": "the same command at --command-baseline",
    "xprof": "XProf `input_pipeline_analyzer` (`xspace_to_tool_data`)",
}
MIB = 1024 * 1024


# ---------------------------------------------------------------- children (one task each)


def _rss_mib() -> float:
    """This process's resident set now, from /proc (not the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def _analyze_function():
    """The analysis entry point: `analysis.analyze`, or `analysis.report.analyze` where that is older."""
    import analysis

    try:
        return analysis.analyze
    except AttributeError:
        from analysis.report import analyze

        return analyze


def _steps_of(result):
    if hasattr(result, "step_source"):
        return result.steps, result.step_source
    return result.source.steps, result.source.kind


def _use_trace_module_at(revision: str) -> None:
    """Make `analysis.read.trace` the file as it was at a git revision (for before/after timings)."""
    shown = [
        subprocess.run(["git", "show", f"{revision}:{where}"], cwd=REPO, capture_output=True, text=True)
        for where in ("analysis/read/trace.py", "analysis/trace.py")
    ]  # its place now, and before analysis/read/
    source = next((done.stdout for done in shown if done.returncode == 0), None)
    if source is None:
        raise SystemExit(f"no analysis/read/trace.py or analysis/trace.py at {revision}")
    path = Path(tempfile.mkdtemp(prefix="devprof-trace-baseline-")) / "trace.py"
    path.write_text(source)
    import analysis.read

    spec = importlib.util.spec_from_file_location("analysis.read.trace", path)
    assert spec is not None and spec.loader is not None  # a .py file's spec, with its source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["analysis.read.trace"] = module
    spec.loader.exec_module(module)
    analysis.read.trace = module


def child(task: str, paths: list[str]) -> None:
    """Run one task, print one JSON line: seconds of the work and RSS before it (after imports)."""
    if task in ("analyze", "analyze-baseline"):
        if task == "analyze-baseline":
            _use_trace_module_at(paths[1])
        analyze = _analyze_function()
        before = _rss_mib()
        start = time.perf_counter()
        result = analyze(paths[0])
        seconds = time.perf_counter() - start
        steps, kind = _steps_of(result)
        extra = {"steps": len(steps), "step_source": kind}
    elif task == "plots":
        import pandas as pd

        from analysis.render import plots

        steps, epochs = pd.read_csv(paths[0]), pd.read_csv(paths[1])
        import matplotlib.figure  # noqa: F401 - matplotlib's import is import time, as the other children's imports

        out = Path(paths[2])
        before = _rss_mib()
        start = time.perf_counter()
        plots.plot_step_breakdown(steps, out / "step_breakdown.png")
        plots.plot_epoch_breakdown(epochs, out / "epoch_breakdown.png")
        seconds = time.perf_counter() - start
        extra = {"steps": len(steps)}
    elif task == "xprof":
        from xprof.convert import raw_to_tool_data

        before = _rss_mib()
        start = time.perf_counter()
        data, _ = raw_to_tool_data.xspace_to_tool_data(
            [paths[0]], "input_pipeline_analyzer", {"use_saved_result": False}
        )
        seconds = time.perf_counter() - start
        extra = {"output_bytes": len(data or b"")}
    elif task == "helper":
        helper_usage(paths[0], paths[1])
        return
    elif task == "stages":
        stages(paths[0])
        return
    elif task == "cprofile":
        cprofile(paths[0], int(paths[1]))
        return
    elif task == "prepare":
        prepare(paths[0], Path(paths[1]))
        return
    elif task == "plot-sizes":
        plot_sizes(int(paths[0]), paths[1] if len(paths) > 1 else None)
        return
    else:
        raise SystemExit(f"unknown task {task}")
    print(json.dumps({"seconds": seconds, "rss_before_mib": before, **extra}))


def prepare(run: str, cache: Path) -> None:
    """Count the trace's events and write its analysed steps and epochs as CSVs (for `plots`)."""
    from analysis.read.trace import read_trace

    trace = read_trace(run)
    count = len(trace.events)
    assert trace.location is not None  # read_trace always locates the file it reads
    xplane = str(trace.location.xplane)
    del trace
    result = _analyze_function()(run)
    steps, kind = _steps_of(result)
    steps.to_csv(cache / "steps.csv", index=False)
    result.epochs.to_csv(cache / "epochs.csv", index=False)
    print(json.dumps({"events": count, "xplane": xplane, "steps": len(steps), "step_source": kind}))


def helper_usage(run: str, out: str) -> None:
    """The whole command in this process (one thread, so it starts its plot helper): the helper's own
    peak RSS and CPU time (`os.wait4`), which the command's `ru_maxrss` folds into a maximum, not a sum."""
    import contextlib
    import io
    import resource

    from analysis.parallel import plots

    started, memory = [], {}
    real_start, real_close = plots.start, plots.PlotHelper.close

    def start(*args, **kwargs):
        started.append(real_start(*args, **kwargs))
        return started[-1]

    def close(helper):  # the helper has drawn and waits to be ended: what of its memory is its own
        try:
            with open(f"/proc/{helper.child.pid}/smaps_rollup") as rollup:
                fields = dict(line.split(":", 1) for line in rollup.read().splitlines()[1:])
            memory["helper_pss_mib"] = int(fields["Pss"].split()[0]) / 1024
            memory["helper_private_mib"] = (
                sum(int(fields[key].split()[0]) for key in ("Private_Clean", "Private_Dirty")) / 1024
            )
        except (OSError, KeyError, ValueError):
            pass
        real_close(helper)

    plots.start = start
    # setattr, not unittest.mock: importing it (asyncio, ~0.1 s, ~11 MiB) would count in this process's numbers
    setattr(plots.PlotHelper, "close", close)
    from profiler import cli

    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["analyze", run, "--out", out])
    rusage = started[0].child.rusage if started and started[0] is not None else None
    usage = rusage if isinstance(rusage, resource.struct_rusage) else None  # os.wait4's, or None
    own = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "code": code,
                "helper": usage is not None,
                "helper_peak_mib": usage.ru_maxrss / 1024 if usage else None,
                "helper_cpu_s": usage.ru_utime + usage.ru_stime if usage else None,
                "main_peak_mib": own.ru_maxrss / 1024,
                "main_cpu_s": own.ru_utime + own.ru_stime,
                **memory,
            }
        )
    )


def _import_tree(stderr: str) -> list[tuple[int, int, int, str]]:
    """`python -X importtime` lines as (level, self µs, cumulative µs, module)."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        own, cumulative, name = line[len("import time:") :].split("|")
        indent = len(name) - len(name.lstrip())
        rows.append(((indent - 1) // 2, int(own), int(cumulative), name.strip()))
    return rows


def startup(args, run: Path, scratch: str, baseline: Path | None) -> None:
    """Start-up on its own: `--help` times, and the import tree of the whole command (`-X importtime`,
    plots drawn in the one process so that one tree holds every import), now and at --command-baseline."""
    trees = [("now", None)] + ([("baseline", baseline)] if baseline else [])
    print(f"\nstart-up: process time, best of {args.startup} (median)\n")
    print("| command | " + " | ".join(label for label, _ in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for argv in (["--help"], ["analyze", "--help"]):
        cells = []
        for _, tree in trees:
            walls = [
                measure([sys.executable, "-m", "profiler", *argv], cwd=tree)["wall_s"] for _ in range(args.startup)
            ]
            cells.append(f"{min(walls):.2f} ({_median(walls):.2f})")
        print(f"| `devprof {' '.join(argv)}` | " + " | ".join(cells) + " |")
    for label, tree in trees:
        runs_ = []
        for _ in range(args.startup):  # the least disturbed of the repeats
            done = subprocess.run(
                [sys.executable, "-X", "importtime", "-m", "profiler", "analyze", str(run), "--out", scratch],
                cwd=tree or REPO,
                capture_output=True,
                text=True,
                env={**_child_env(tree), "DEVPROF_FORK": "0"},
            )
            rows = _import_tree(done.stderr)
            runs_.append((sum(cumulative for level, _, cumulative, _ in rows if level == 0), rows))
        total, rows = min(runs_, key=lambda found: found[0])
        by_root: dict[str, int] = {}
        for _, own, _, name in rows:
            root = name.split(".")[0]
            root = root if root in ("numpy", "pandas", "matplotlib", "PIL", "analysis", "profiler") else "other"
            by_root[root] = by_root.get(root, 0) + own
        print(
            f"\nimports of `devprof analyze RUN --out DIR` ({label}, plots drawn in the one process; the least of "
            f"{args.startup} runs): {total / 1e6:.2f} s in all\n"
        )
        print("| package (own time of its modules) | s | share |")
        print("|---|---:|---:|")
        for root, own in sorted(by_root.items(), key=lambda item: -item[1]):
            print(f"| {root} | {own / 1e6:.3f} | {own / total:.0%} |")
        print("\n| imported by the command itself (cumulative) | s |")
        print("|---|---:|")
        for _, _, cumulative, name in sorted((r for r in rows if r[0] == 0), key=lambda r: -r[2])[:10]:
            print(f"| `{name}` | {cumulative / 1e6:.3f} |")


def stages(run: str) -> None:
    """Seconds and RSS after each stage of `analyze` on a trace (read_trace's stages, then the rest)."""
    import gc

    from analysis.read import trace as tr

    analyze = _analyze_function()
    marks = []
    start = time.perf_counter()

    def mark(name):
        marks.append({"stage": name, "s": time.perf_counter() - start, "rss_mib": _rss_mib()})

    mark("imports done")
    location = tr.locate_trace(run)
    space = tr._decode_file(location.xplane, tr.EVENT_STAT_COLUMNS)
    mark(f"file decoded into columns ({len(space.events.line_row):,} events, {len(space.stat_values):,} kept stats)")
    planes, lines = tr._plane_and_line_tables(space)
    events, _ = tr._events_table(space, planes, lines)  # (the events with impossible times: not dropped here)
    mark("events table without stat columns")
    tr._add_stat_columns(events, space)
    mark(f"stat columns added ({len(events):,} rows, {events.memory_usage(deep=False).sum() / MIB:.0f} MiB shallow)")
    stats = tr._stats_table(space)
    del space
    mark("stats table; decoded columns freed")
    del planes, lines, stats, events
    gc.collect()
    mark("tables freed")
    restart = time.perf_counter()
    analyze(run)
    marks.append(
        {"stage": "whole analyze again (read included)", "s": time.perf_counter() - restart, "rss_mib": _rss_mib()}
    )
    print(json.dumps(marks))


def cprofile(run: str, top: int) -> None:
    import cProfile
    import io
    import pstats

    from analysis import analyze

    profile = cProfile.Profile()
    profile.enable()
    analyze(run)
    profile.disable()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).strip_dirs().sort_stats(order).print_stats(top)
        print(f"## cProfile of analyze, by {order}\n")
        print("```\nncalls" + text.getvalue().split("ncalls", 1)[-1].rstrip() + "\n```\n")


def _load_plots_at(revision: str):
    """analysis/plots.py as it was at a git revision, as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{revision}:analysis/plots.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    with tempfile.TemporaryDirectory(prefix="devprof-plots-baseline-") as folder:
        path = Path(folder) / "plots_baseline.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("plots_baseline", path)
        assert spec is not None and spec.loader is not None  # a .py file's spec, with its source loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def plot_sizes(repeats: int, baseline: str | None) -> None:
    """Seconds per plot at several sizes, this plots.py and (if given) an older one, alternating."""
    import numpy as np
    import pandas as pd

    from analysis.render import plots

    modules = {"now": plots}
    if baseline:
        modules["baseline"] = _load_plots_at(baseline)
    import matplotlib.figure  # noqa: F401

    rng = np.random.default_rng(0)

    def steps(n):
        frame = pd.DataFrame(
            {
                "step": np.arange(10, 10 + n),
                "input_ms": rng.random(n) * 5,
                "compute_ms": 30 + rng.random(n) * 5,
                "collective_ms": 0.0,
                "host_ms": rng.random(n) * 3,
                "compile_ms": 0.0,
            }
        )
        frame.loc[0, ["compile_ms", "host_ms"]] = [100.0, 103.0]
        frame["step_ms"] = frame[["input_ms", "compute_ms", "host_ms"]].sum(axis=1)
        return frame

    rows = 50_000
    host = pd.DataFrame(
        {
            "time_s": 1.7e9 + 0.1 * np.arange(rows),
            "cpu_pct": rng.random(rows) * 100,
            "cpu0_pct": rng.random(rows) * 100,
            "cpu1_pct": rng.random(rows) * 100,
            "proc_cpu_pct": rng.random(rows) * 200,
        }
    )

    def step_breakdown(frame: pd.DataFrame) -> Callable[[ModuleType, Path], object]:
        return lambda module, path: module.plot_step_breakdown(frame, path)

    cases = {f"plot_step_breakdown, {n:,} steps": step_breakdown(steps(n)) for n in (100, 800, 1000, 3000)}
    cases["plot_utilization, 50,000 rows, 10 epochs"] = lambda module, path: module.plot_utilization(
        {"host": host}, list(host["time_s"][:: rows // 10]), path
    )
    results: dict[str, dict[str, list[float]]] = {case: {name: [] for name in modules} for case in cases}
    with tempfile.TemporaryDirectory(prefix="devprof-plot-sizes-") as out:
        for repeat in range(repeats):
            for case, draw in cases.items():
                names = list(modules)
                for name in names if repeat % 2 == 0 else names[::-1]:
                    start = time.perf_counter()
                    draw(modules[name], Path(out) / f"{name}.png")
                    results[case][name].append(time.perf_counter() - start)
    print(json.dumps(results))


# ---------------------------------------------------------------- the parent


def _python(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", *args]


def _child_env(tree: Path | None = None) -> dict:
    """The environment of every child: it imports the tree this script sits in, or `tree` (also `devprof`,
    whose editable install would otherwise point at the checkout it was installed from), from its bytecode
    (`compiled`), as an installed package is."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {
        **environment,
        "PYTHONPATH": os.pathsep.join([str(tree or REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


def compiled(tree: Path) -> None:
    """Byte-compile the tree's packages, as `pip install` leaves them: where PYTHONDONTWRITEBYTECODE is set,
    every child would otherwise compile devprof's sources again (0.14 s of each command), while XProf's
    converter, installed, runs from its bytecode."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            *(str(tree / package) for package in ("analysis", "profiler", "models")),
        ],
        check=True,
        capture_output=True,
    )


def _tree_at(revision: str) -> Path:
    """The repository as of a git revision, in a temporary folder (for the command of --command-baseline);
    a folder named instead is used as it is (a tree with some changes taken out)."""
    if Path(revision).is_dir():
        return Path(revision).resolve()
    folder = Path(tempfile.mkdtemp(prefix="devprof-command-baseline-"))
    archive = subprocess.run(["git", "archive", revision], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def _command(task: str, run: Path, out: str, baseline: Path | None) -> tuple[list[str], dict, Path | None]:
    """The whole `devprof analyze RUN --out DIR`: as it is (plots drawn by the helper process), with
    everything in the one process (`command-one-process`), or at --command-baseline."""
    argv = [sys.executable, "-m", "profiler", "analyze", str(run), "--out", out]
    if task == "command-one-process":
        return argv, {"DEVPROF_FORK": "0"}, None
    if task == "command-baseline":
        return argv, {}, baseline
    if task.startswith("command-without-"):  # one speed trick switched off, in a tree that has the switch (ec0d91c)
        return argv, {"DEVPROF_WITHOUT": task.removeprefix("command-without-")}, None
    return argv, {}, None


def summed_pss(command: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, int]:
    """The peak, in MiB, of the summed PSS of a process and all its descendants, sampled every 10 ms (a
    fork's shared pages count once over its processes, unlike the sum of their RSS), and how many there were."""
    import psutil

    def pss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                return next((int(line.split()[1]) * 1024 for line in rollup if line.startswith("Pss:")), 0)
        except OSError:
            return 0

    peak, count = 0, 0
    process = subprocess.Popen(
        command,
        cwd=cwd or REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**_child_env(cwd), **(env or {})},
    )
    root = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            processes = [process.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            break
        total = sum(pss(pid) for pid in processes)
        if total > peak:
            peak, count = total, len(processes)
        time.sleep(0.01)
    if process.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({process.returncode})")
    return peak / MIB, count


def measure(command: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run one fresh subprocess: its wall time, CPU time and peak RSS (of it and the children it waited
    for: their largest, not their sum), and what it printed last (JSON)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # pipes could fill and block
        start = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=cwd or REPO, stdout=out, stderr=err, text=True, env={**_child_env(cwd), **(env or {})}
        )
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        printed, errors = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({process.returncode}):\n{errors[-3000:]}")
    result = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mib": usage.ru_maxrss / 1024,
    }  # ru_maxrss is in KiB on Linux
    last = printed.strip().splitlines()[-1] if printed.strip() else ""
    if last.startswith("{"):
        result.update(json.loads(last))
    elif last.startswith("["):
        result["marks"] = json.loads(last)
    return result


def ensure_run(args, window: tuple[int, int] | None = None) -> Path:
    """The cached run with the long profiler window (made with `devprof run` if missing)."""
    start, stop = window or args.window
    name = f"trace-b{args.batch_size}-l{args.host_tracer_level}-{start}-{stop}"
    run = args.cache / name
    done = run / "run.json"
    if done.is_file() and json.loads(done.read_text()).get("status") == "complete" and any(run.glob("**/*.xplane.pb")):
        return run
    if run.exists():
        raise SystemExit(f"{run} exists but is not a complete run with a trace: remove it to make it again")
    args.cache.mkdir(parents=True, exist_ok=True)
    (args.cache / f"{name}.facts.json").unlink(missing_ok=True)  # the event count of an older trace
    images = args.batch_size * (stop + 20)
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
        str(images),
        "--batch-size",
        str(args.batch_size),
        "--epochs",
        "1",
        "--profile-steps",
        f"{start}:{stop}",
        "--host-tracer-level",
        str(args.host_tracer_level),
        "--no-sample",
        "--quiet",
        "--out",
        str(args.cache),
        "--run-name",
        name,
    ]
    print(f"making the trace: {shlex.join(command)}", file=sys.stderr)
    began = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, env=_child_env())
    print(f"made in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return run


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def _facts(run: Path) -> dict:
    facts_path = run.parent / f"{run.name}.facts.json"
    if not facts_path.is_file():
        facts_path.write_text(json.dumps(measure(_python("prepare", str(run), str(run.parent)))))
    return json.loads(facts_path.read_text())


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares of y = a + b x, and the log-log slope (1 = linear growth) from the smallest to the largest x."""
    import math

    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    slope = math.log(ys[-1] / ys[0]) / math.log(xs[-1] / xs[0])
    return my - b * mx, b, slope


def scale(args, tasks: list[str], argv: list[str] | None) -> int:
    """The same tasks on traces of several sizes (profiler windows of --scale steps), alternated, and the curves."""
    if args.report_only:
        return report_saved(args, tasks, argv)
    runs = {}
    for steps in args.scale:
        run = ensure_run(args, (10, 10 + steps))
        facts = _facts(run)
        runs[steps] = (run, facts)
        print(
            f"{steps} steps: {facts['events']:,} events, {Path(facts['xplane']).stat().st_size / 1e6:.1f} MB",
            file=sys.stderr,
        )
    results: dict[tuple[int, str], list[dict]] = {(steps, task): [] for steps in args.scale for task in tasks}
    log = args.results.open("a") if args.results else None
    baseline = _tree_at(args.command_baseline) if "command-baseline" in tasks else None
    for tree in (REPO, baseline):
        if tree is not None:
            compiled(tree)
    with tempfile.TemporaryDirectory(prefix="devprof-trace-scale-out-") as scratch:

        def command(task, run, facts) -> tuple[list[str], dict, Path | None]:
            if task.startswith("command"):
                return _command(task, run, scratch, baseline)
            return (
                {
                    "analyze": lambda: _python("analyze", str(run)),
                    "analyze-baseline": lambda: _python("analyze-baseline", str(run), args.trace_baseline or "HEAD"),
                    "xprof": lambda: _python("xprof", facts["xplane"]),
                }[task](),
                {},
                None,
            )

        for task in {"analyze", *(t for t in tasks if t.startswith("command"))}:  # warm the interpreter's bytecode
            measure(*command(task, *runs[args.scale[0]]))
        if args.startup:
            startup(args, runs[args.scale[0]][0], scratch, baseline)
        for repeat in range(args.repeats):
            # Sizes alternate too: small to large, then large to small.
            sizes = args.scale if repeat % 2 == 0 else args.scale[::-1]
            for index, steps in enumerate(sizes):
                run, facts = runs[steps]
                shift = (repeat + index) % len(tasks)
                for task in tasks[shift:] + tasks[:shift]:
                    result = measure(*command(task, run, facts))
                    results[(steps, task)].append(result)
                    if log:
                        log.write(
                            json.dumps(
                                {"steps": steps, "events": facts["events"], "task": task, "repeat": repeat, **result}
                            )
                            + "\n"
                        )
                        log.flush()
                    work = f"{result['seconds']:.2f} s work, " if "seconds" in result else ""
                    print(
                        f"repeat {repeat + 1}, {facts['events']:,} events, {task}: {work}"
                        f"{result['wall_s']:.2f} s process, {result['peak_mib']:.0f} MiB peak",
                        file=sys.stderr,
                    )
        helpers = (
            {steps: measure(_python("helper", str(run), scratch)) for steps, (run, _) in runs.items()}
            if "command" in tasks
            else {}
        )
        together = (
            {
                steps: (summed_pss(*command("command", run, facts)), summed_pss(*command("xprof", run, facts)))
                for steps, (run, facts) in runs.items()
            }
            if {"command", "xprof"} <= set(tasks)
            else {}
        )
    report_scale(runs, results, tasks, args, argv)
    if together:
        print(
            "\nall the command's processes together (it, the child decoding half the events, the child analysing the "
            "tf.data stages, the plot helper): the peak of their summed PSS (proportional set size: a page two "
            "processes share counts half in each), sampled every 10 ms, one run per size\n"
        )
        print("| events | whole command: summed PSS MiB | processes then | XProf: PSS MiB | command / XProf |")
        print("|---:|---:|---:|---:|---:|")
        for steps, ((mine, processes), (theirs, _)) in sorted(together.items()):
            print(f"| {runs[steps][1]['events']:,} | {mine:.0f} | {processes} | {theirs:.0f} | {mine / theirs:.2f} |")
    if helpers:
        print(
            "\nthe plot helper of the whole command, one run per size in a fresh process: each process's own peak "
            "RSS and CPU time (the command's peak RSS above is the larger of the two, not their sum)\n"
        )
        print(
            "| events | command process: peak RSS MiB | CPU s | helper: peak RSS MiB | its own (private) MiB | CPU s "
            "| command's peak + helper's own MiB |" + (" that / XProf's peak (median) |" if "xprof" in tasks else "")
        )
        print("|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if "xprof" in tasks else ""))
        for steps, helper in helpers.items():
            if not helper.get("helper"):
                print(
                    f"| {runs[steps][1]['events']:,} | {helper['main_peak_mib']:.0f} | {helper['main_cpu_s']:.2f} | "
                    "no helper | | |"
                )
                continue
            own = helper.get("helper_private_mib", helper["helper_peak_mib"])
            both = helper["main_peak_mib"] + own
            xprof = (
                f" {both / _median([r['peak_mib'] for r in results[(steps, 'xprof')]]):.2f} |"
                if "xprof" in tasks
                else ""
            )
            print(
                f"| {runs[steps][1]['events']:,} | {helper['main_peak_mib']:.0f} | {helper['main_cpu_s']:.2f} | "
                f"{helper['helper_peak_mib']:.0f} | {own:.0f} | {helper['helper_cpu_s']:.2f} | {both:.0f} |{xprof}"
            )
    return 0


def report_saved(args, tasks, argv) -> int:
    """The tables and plot of the measurements saved in --results (the same sizes and tasks)."""
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    runs = {}
    results: dict[tuple[int, str], list[dict]] = {(steps, task): [] for steps in args.scale for task in tasks}
    for row in rows:
        if (row["steps"], row["task"]) in results:
            results[(row["steps"], row["task"])].append(row)
    for steps in args.scale:
        run = args.cache / f"trace-b{args.batch_size}-l{args.host_tracer_level}-10-{10 + steps}"
        runs[steps] = (run, _facts(run))
    args.repeats = min(len(v) for v in results.values())
    report_scale(runs, results, tasks, args, argv)
    return 0


def _series(results, runs, task, key, stat=statistics.median):
    """Per size (by events), the median (or `stat`) over repeats of one measured key."""
    return [stat([r[key] for r in results[(steps, task)]]) for steps in runs]


def report_scale(runs, results, tasks, args, argv) -> None:
    events = [facts["events"] for _, facts in runs.values()]
    print(f"\n{args.repeats} repeats per size, sizes and tasks alternated, each in a fresh process\n")
    print(
        "| events | MB | task | work s (median) | range | process s | range | CPU s | peak RSS MiB | range "
        "| µs / event (process) |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for steps, (run, facts) in runs.items():
        size = Path(facts["xplane"]).stat().st_size / 1e6
        for task in tasks:
            rows = results[(steps, task)]
            work = [r.get("seconds", r["wall_s"]) for r in rows]
            walls, peaks = [r["wall_s"] for r in rows], [r["peak_mib"] for r in rows]
            cpu = _median([r.get("cpu_s", float("nan")) for r in rows])
            print(
                f"| {facts['events']:,} | {size:.0f} | {TASK_LABELS[task]} | {_median(work):.2f} | {_spread(work)} | "
                f"{_median(walls):.2f} | {_spread(walls)} | {cpu:.2f} | {_median(peaks):.0f} | {_spread(peaks, 0)} | "
                f"{_median(walls) / facts['events'] * 1e6:.2f} |"
            )
    if "xprof" in tasks:
        print("\nratios to XProf's converter, per repeat (side by side), median and range:\n")
        print("| events | task | work time | process time | CPU time | peak RSS |")
        print("|---:|---|---:|---:|---:|---:|")
        for steps, (run, facts) in runs.items():
            xprof_rows = results[(steps, "xprof")]
            for task in tasks:
                if task == "xprof":
                    continue
                rows = results[(steps, task)]
                walls = [r["wall_s"] / x["wall_s"] for r, x in zip(rows, xprof_rows)]
                peaks = [r["peak_mib"] / x["peak_mib"] for r, x in zip(rows, xprof_rows)]
                work_ratios = (
                    [r["seconds"] / x["seconds"] for r, x in zip(rows, xprof_rows)] if "seconds" in rows[0] else None
                )
                work_cell = f"{_median(work_ratios):.2f} ({_spread(work_ratios)})" if work_ratios else "–"
                cpu_ratios = [
                    r.get("cpu_s", float("nan")) / x.get("cpu_s", float("nan")) for r, x in zip(rows, xprof_rows)
                ]
                print(
                    f"| {facts['events']:,} | {task} | {work_cell} | {_median(walls):.2f} ({_spread(walls)}) | "
                    f"{_median(cpu_ratios):.2f} | {_median(peaks):.2f} ({_spread(peaks)}) |"
                )
    print("\nbest (least disturbed) process time of the repeats, per size, and its ratio to XProf's best:\n")
    print("| events | " + " | ".join(TASK_LABELS[t] for t in tasks) + " |")
    print("|---:|" + "---:|" * len(tasks))
    best = {task: _series(results, runs, task, "wall_s", min) for task in tasks}
    for index, e in enumerate(events):
        cells = []
        for task in tasks:
            ratio = f" ({best[task][index] / best['xprof'][index]:.2f})" if "xprof" in tasks and task != "xprof" else ""
            cells.append(f"{best[task][index]:.2f}{ratio}")
        print(f"| {e:,} | " + " | ".join(cells) + " |")
    if len(set(events)) < 2:
        print(
            f"command: {shlex.join([Path(sys.executable).name, 'bench/' + Path(__file__).name, *(argv or sys.argv[1:])])}"
        )
        return  # one size has no growth to fit
    print(
        "\ngrowth: least squares over the sizes (best process time, median peak RSS), and the log-log slope "
        "from the smallest to the largest trace (1.00 = linear):\n"
    )
    print("| task | s per 1M events | fixed s | time slope | MiB per 1M events | fixed MiB | RSS slope |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    millions = [e / 1e6 for e in events]
    for task in tasks:
        a, b, slope = _fit(millions, best[task])
        ma, mb, mslope = _fit(millions, _series(results, runs, task, "peak_mib"))
        print(f"| {TASK_LABELS[task]} | {b:.2f} | {a:.2f} | {slope:.2f} | {mb:.0f} | {ma:.0f} | {mslope:.2f} |")
    if args.plot:
        plot_scale(runs, results, tasks, args.plot)
        print(f"\nplot: {args.plot}")
    print(
        f"command: {shlex.join([Path(sys.executable).name, 'bench/' + Path(__file__).name, *(argv or sys.argv[1:])])}"
    )


def plot_scale(runs, results, tasks, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [facts["events"] / 1e6 for _, facts in runs.values()]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = {
        "analyze": "devprof read + analysis",
        "analyze-baseline": "devprof, older trace.py",
        "command": "devprof analyze (whole command)",
        "xprof": "XProf input_pipeline_analyzer",
        "plots": "plots",
        "command-one-process": "devprof analyze, all in one process",
        "command-baseline": "devprof analyze at --command-baseline",
    }
    for task in tasks:
        style = {"marker": "o" if task != "xprof" else "s", "linestyle": "--" if task == "command" else "-"}
        left.plot(events, _series(results, runs, task, "wall_s", min), label=labels[task], **style)
        right.plot(events, [m / 1024 for m in _series(results, runs, task, "peak_mib")], label=labels[task], **style)
    left.set(xlabel="trace events (millions)", ylabel="process time, s (best of the repeats)", title="Time")
    right.set(xlabel="trace events (millions)", ylabel="peak RSS, GiB (median)", title="Peak memory")
    for axes in (left, right):
        axes.set_xlim(0), axes.set_ylim(0)
        axes.grid(alpha=0.3)
    left.legend(fontsize=8)
    figure.suptitle("Reading and analysing one .xplane.pb, fresh process per point", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "devprof-bench-trace-scale",
        help="folder holding the generated run (made once, reused)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each task (alternated)")
    parser.add_argument("--profile-steps", default="10:1010", help="the run's profiler window START:STOP")
    parser.add_argument("--host-tracer-level", type=int, default=2, choices=(1, 2, 3))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help=f"comma-separated subset of {','.join(TASKS)}; with --scale also command-one-process "
        "(the plots drawn in the command's own process)",
    )
    parser.add_argument("--plot-repeats", type=int, default=3, help="repeats of the plot-size timings (0: skip)")
    parser.add_argument("--plots-baseline", metavar="REV", help="also time analysis/plots.py as of this git revision")
    parser.add_argument(
        "--trace-baseline",
        metavar="REV",
        help="also time read + analysis with analysis/trace.py as of this git revision (task analyze-baseline)",
    )
    parser.add_argument(
        "--scale",
        type=lambda text: [int(part) for part in text.split(",")],
        metavar="STEPS,...",
        help="traces of several sizes: profiler windows of these many steps (e.g. 60,120,240,480,1000)",
    )
    parser.add_argument("--plot", type=Path, help="with --scale: draw time and peak RSS against events to this PNG")
    parser.add_argument("--results", type=Path, help="with --scale: append every measurement to this JSON-lines file")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="with --scale and --results: report and plot the measurements in --results, run nothing",
    )
    parser.add_argument(
        "--command-baseline",
        metavar="REV",
        help="with --scale: also time the whole command as of this git revision, or in this folder "
        "holding a copy of the repository (task command-baseline)",
    )
    parser.add_argument(
        "--startup",
        type=int,
        nargs="?",
        const=5,
        default=0,
        metavar="REPEATS",
        help="with --scale: time `devprof --help` and list the command's imports (python -X importtime)",
    )
    parser.add_argument("--stages", action="store_true", help="time and RSS after each stage of read + analysis")
    parser.add_argument(
        "--cprofile",
        type=int,
        nargs="?",
        const=25,
        default=0,
        metavar="TOP",
        help="cProfile analyze and print the TOP functions",
    )
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1:])
        return 0
    start, stop = (int(part) for part in args.profile_steps.split(":"))
    args.window = (start, stop)
    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    if args.trace_baseline and "analyze-baseline" not in tasks:
        tasks.insert(1, "analyze-baseline")
    if args.command_baseline and "command-baseline" not in tasks:
        tasks.append("command-baseline")
    if args.scale:
        return scale(args, tasks, argv)

    run = ensure_run(args)
    facts_path = run.parent / f"{run.name}.facts.json"
    if not facts_path.is_file():
        facts = measure(_python("prepare", str(run), str(run.parent)))
        facts_path.write_text(json.dumps(facts))
    facts = json.loads(facts_path.read_text())
    xplane = Path(facts["xplane"])
    print(
        f"trace: {xplane} ({xplane.stat().st_size / 1e6:.1f} MB), {facts['events']:,} events, "
        f"{facts['steps']:,} steps found by {facts['step_source']}",
        file=sys.stderr,
    )

    results: dict[str, list[dict]] = {task: [] for task in tasks}
    with tempfile.TemporaryDirectory(prefix="devprof-trace-scale-out-") as scratch:
        commands = {
            "analyze": _python("analyze", str(run)),
            "analyze-baseline": _python("analyze-baseline", str(run), args.trace_baseline or "HEAD"),
            "plots": _python("plots", str(run.parent / "steps.csv"), str(run.parent / "epochs.csv"), scratch),
            "command": [str(Path(sys.executable).with_name("devprof")), "analyze", str(run), "--out", scratch],
            "xprof": _python("xprof", str(xplane)),
        }
        measure(commands["analyze"])  # warm the file cache and the interpreter's bytecode
        for repeat in range(args.repeats):
            order = tasks[repeat % len(tasks) :] + tasks[: repeat % len(tasks)]
            for task in order:
                result = measure(commands[task])
                results[task].append(result)
                work_note = f"{result['seconds']:.2f} s work, " if "seconds" in result else ""
                print(
                    f"repeat {repeat + 1} {task}: {work_note}{result['wall_s']:.2f} s process, "
                    f"{result['peak_mib']:.0f} MiB peak",
                    file=sys.stderr,
                )

    if not tasks or not args.repeats:
        results = {}
    print(
        f"\ntrace: {facts['events']:,} events, {xplane.stat().st_size / 1e6:.1f} MB, {facts['steps']:,} steps "
        f"({facts['step_source']}); {args.repeats} repeats, alternated, each in a fresh process\n"
    )
    if results:
        print(
            "| | work s (median) | range | process s (median) | peak RSS MiB (median) | range | RSS after imports MiB |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
    for task in results:
        rows = results[task]
        work = [r["seconds"] for r in rows] if "seconds" in rows[0] else [r["wall_s"] for r in rows]
        walls, peaks = [r["wall_s"] for r in rows], [r["peak_mib"] for r in rows]
        before = f"{_median([r['rss_before_mib'] for r in rows]):.0f}" if "rss_before_mib" in rows[0] else "–"
        print(
            f"| {TASK_LABELS[task]} | {_median(work):.2f} | {_spread(work)} | {_median(walls):.2f} | "
            f"{_median(peaks):.0f} | {_spread(peaks, 0)} | {before} |"
        )
    if "xprof" in results and len(results) > 1:
        print()
        xprof_rows = results["xprof"]
        for task in tasks:
            if task == "xprof":
                continue
            rows = results[task]
            # Ratios per repeat (the two ran next to each other), then their median.
            walls = [r["wall_s"] / x["wall_s"] for r, x in zip(rows, xprof_rows)]
            peaks = [r["peak_mib"] / x["peak_mib"] for r, x in zip(rows, xprof_rows)]
            line = f"- {task} / xprof: "
            if "seconds" in rows[0]:
                work = [r["seconds"] / x["seconds"] for r, x in zip(rows, xprof_rows)]
                line += f"work time **{_median(work):.2f}** ({_spread(work)}), "
            print(
                line + f"process time **{_median(walls):.2f}** ({_spread(walls)}), "
                f"peak RSS **{_median(peaks):.2f}** ({_spread(peaks)})"
            )

    if args.plot_repeats:
        sizes = measure(
            _python("plot-sizes", str(args.plot_repeats), *([args.plots_baseline] if args.plots_baseline else []))
        )
        names = ["now"] + (["baseline"] if args.plots_baseline else [])
        header = "| plot | this plots.py, median s | range |"
        if args.plots_baseline:
            header += f" plots.py at {args.plots_baseline}, median s | range | now / then |"
        print(
            f"\nplotting alone, {args.plot_repeats} repeats, alternated, one process "
            f"(peak RSS {sizes['peak_mib']:.0f} MiB)\n"
        )
        print(header)
        print("|---|" + "---:|" * (2 * len(names) + (1 if args.plots_baseline else 0)))
        for case, by_module in sizes.items():
            if not isinstance(by_module, dict):
                continue
            cells = [f"{_median(by_module[name]):.3f} | {_spread(by_module[name], 3)}" for name in names]
            ratio = (
                f" | {_median([a / b for a, b in zip(by_module['now'], by_module['baseline'])]):.3f}"
                if args.plots_baseline
                else ""
            )
            print(f"| {case} | " + " | ".join(cells) + ratio + " |")

    if args.stages:
        marks = measure(_python("stages", str(run)))
        print(f"\nstages of read + analysis (one process, peak RSS {marks['peak_mib']:.0f} MiB)\n")
        print("| after | s since imports | RSS MiB |")
        print("|---|---:|---:|")
        for mark in marks["marks"]:
            print(f"| {mark['stage']} | {mark['s']:.2f} | {mark['rss_mib']:.0f} |")
    if args.cprofile:
        output = subprocess.run(
            _python("cprofile", str(run), str(args.cprofile)), cwd=REPO, capture_output=True, text=True, check=True
        )
        print("\n" + output.stdout)
    print(
        f"command: {shlex.join([Path(sys.executable).name, 'bench/' + Path(__file__).name, *(argv or sys.argv[1:])])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
