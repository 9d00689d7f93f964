"""Work lent another core (`analysis.parallel`): a child's answer is the one this process would compute,
its warnings are reported here, a child that gives no answer leaves its work to this process, a fork
happens only in a process of one OS thread, and the command's plot helper draws the same files.

The command's own forks need a process of one thread, which a pytest process is not (numpy's): the
tests of the whole command run it in a fresh Python (slow tier); the others say the process is one thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import parallel, pipeline, worker
from analysis.parallel import child as parallel_child
from analysis.read.run_files import RunFileWarning
from input_traces import write_prefetched_map_loop
from memory_fixtures import write_memory_trace
from repo_paths import REPO


@pytest.fixture
def answers(monkeypatch):
    """A process where a fork is safe (one OS thread, two cores); what each forked child answered."""
    monkeypatch.setattr(parallel, "os_threads", lambda: 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv(parallel.ENV_VAR, raising=False)
    seen = []
    result = parallel_child.Child.result

    def recorded(self, *args, **kwargs):
        answer = result(self, *args, **kwargs)
        seen.append(answer is not None)
        return answer

    monkeypatch.setattr(parallel_child.Child, "result", recorded)
    return seen


def _children() -> list:
    import psutil

    return psutil.Process().children()


def test_a_fork_is_safe_only_in_a_process_of_one_thread_on_two_cores(monkeypatch):
    threads = [1]
    monkeypatch.setattr(parallel, "os_threads", lambda: threads[0])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv(parallel.ENV_VAR, raising=False)
    assert parallel.can_fork()
    monkeypatch.setenv(parallel.ENV_VAR, "0")
    assert not parallel.can_fork() and parallel.Helpers().child(lambda receive: 1) is None
    monkeypatch.delenv(parallel.ENV_VAR)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert not parallel.can_fork()  # one core: nothing to share
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    threads[0] = 2
    assert not parallel.can_fork()  # another thread may hold a lock the child would wait on forever
    assert parallel.Helpers(fork=True).child(lambda receive: 1) is None
    threads[0] = 1
    assert parallel.can_fork() and not parallel.Helpers(fork=False).child(lambda receive: 1)


def test_the_os_counts_every_thread_numpys_and_pythons_alike():
    before = parallel.os_threads()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert parallel.os_threads() == before + 1
    finally:
        stop.set()
        thread.join()


@pytest.mark.slow  # starts a subprocess
def test_numpys_own_threads_make_a_fork_unsafe():
    # what made the Python API fork unsafely while it counted Python threads only
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import numpy, threading\nfrom analysis import parallel\n"
            "print(threading.active_count(), parallel.os_threads() > 1, parallel.can_fork())",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={key: value for key, value in os.environ.items() if key != "OPENBLAS_NUM_THREADS"},
    )
    if (os.cpu_count() or 1) > 1:
        assert done.stdout.split() == ["1", "True", "False"], done.stderr


def test_the_childs_answer_and_its_warnings_are_this_processs(answers):
    parent = os.getpid()

    def work(given):
        warnings.warn(RunFileWarning("steps.csv: 2 rows skipped"), stacklevel=1)
        before = np.arange(100_000) * 3  # what needs nothing given
        return os.getpid(), before + given()

    with pytest.warns(RunFileWarning, match="2 rows skipped"):
        with parallel.Helpers().beside(work) as beside:
            beside.give(np.ones(100_000, dtype=np.int64))
            pid, values = beside.result()
    assert answers == [True] and pid != parent  # computed by the child, with what this process gave it
    assert np.array_equal(values, np.arange(100_000) * 3 + 1)
    assert not _children()


def test_arrays_of_every_kind_come_back_whole(answers):
    expected: list[np.ndarray] = [np.arange(1 + i % 7, dtype=np.int64) * i for i in range(1100)]
    expected += [np.linspace(0, 1, 300_001), np.array([], dtype=np.uint8), np.frombuffer(b"read-only", dtype=np.uint8)]
    with parallel.Helpers().beside(lambda given: [np.array(array) for array in expected]) as beside:
        got = beside.result()
    assert answers == [True] and len(got) == len(expected)
    for mine, theirs in zip(expected, got):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)


@pytest.mark.parametrize("answered", [True, False])
def test_what_waits_for_a_free_core_starts_once_after_the_first_child_has_ended(answered, answers):
    parent, called = os.getpid(), []

    def work(given):
        if not answered and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return "done"

    helpers = parallel.Helpers()
    helpers._waiting += [lambda: called.append(_children())]
    with helpers.beside(work) as beside:
        beside.give(None)
        assert called == []
        assert beside.result() == "done"
    assert answers == [answered]
    assert called == [[]]  # once, with the child ended and reaped
    with helpers.beside(work) as beside:
        beside.give(None)
        beside.result()
    assert called == [[]]


def test_a_child_that_gives_no_answer_leaves_the_work_here(answers):
    parent = os.getpid()

    def work(given):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid(), given()

    with parallel.Helpers().beside(work) as beside:
        beside.give("steps")
        assert beside.result() == (parent, "steps")
    assert answers == [False] and not _children()


def test_an_error_in_the_work_is_raised_here_as_without_a_child(answers):
    def work(given):
        raise ValueError("a stage that cannot be analysed")

    with pytest.raises(ValueError, match="cannot be analysed"):
        with parallel.Helpers().beside(work) as beside:
            beside.give(None)
            beside.result()
    assert answers == [False] and not _children()


def test_a_child_whose_parent_gives_nothing_ends_without_an_answer(answers):
    import psutil

    with parallel.Helpers().beside(lambda given: given()) as beside:
        assert beside.child is not None
        child = beside.child.pid
    assert answers == [] and not (psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE)


def test_without_a_fork_the_work_is_done_when_asked(answers):
    done: list[int] = []

    def work(given):
        done.append(os.getpid())
        return given()

    with parallel.Helpers(fork=False).beside(work) as beside:
        beside.give("here")
        assert done == []
        assert beside.result() == "here"
    assert done == [os.getpid()] and answers == []


def test_the_analysis_is_the_same_with_its_stages_analysed_by_a_child(tmp_path, monkeypatch, answers):
    trace = write_prefetched_map_loop(tmp_path / "loop.xplane.pb", steps=8)
    alone = pipeline.analyzed(trace, None, helpers=parallel.Helpers(fork=False))[0]
    assert answers == []
    monkeypatch.setattr(worker, "BESIDE_MIN_EVENTS", 0)
    beside = pipeline.analyzed(trace, None, helpers=parallel.Helpers())[0]
    assert answers == [True]
    assert not alone.input_stages.empty  # the child had stages to find
    pd.testing.assert_frame_equal(beside.input_stages, alone.input_stages)
    assert beside.render("json") == alone.render("json")
    assert beside.findings == alone.findings and beside.verdict == alone.verdict


def test_a_stage_asks_the_view_for_its_step_free_work_once(tmp_path):
    from analysis.breakdown.input_stages import input_stages, stage_times
    from analysis.read.inputs import read_inputs

    view = read_inputs(write_prefetched_map_loop(tmp_path / "loop.xplane.pb", steps=8)).trace
    assert view is not None
    first = stage_times(view)
    assert stage_times(view) is first  # kept on the view: a child that worked it out early saves the stage its time
    steps = pd.DataFrame({"start_ns": [view.window[0]], "end_ns": [view.window[1]], "steps": [1]})
    input_stages(view, steps)
    assert stage_times(view) is first


# ---------------------------------------------------------------- the command, in a fresh process


def _run_dir(root: Path) -> Path:
    """A run directory (trace with allocator events, steps.csv, run.json, a host sampler): every PNG and CSV."""
    run = root / "run"
    write_memory_trace(run / "plugins" / "profile" / "s1" / "host.xplane.pb", steps=4)
    t = 1_700_000_000.0
    rows = [
        dict(
            epoch=1 + step // 2,
            step=step,
            steps=1,
            start_time_s=t + 0.02 * step,
            input_ms=1.0,
            call_ms=10.0,
            other_host_ms=0.5,
            step_ms=11.5,
            images=8,
        )
        for step in range(4)
    ]
    pd.DataFrame(rows).to_csv(run / "steps.csv", index=False)
    epochs = [
        {"epoch": 1, "seconds": 0.05, "train_seconds": 0.04, "images": 16},
        {"epoch": 2, "seconds": 0.05, "train_seconds": 0.04, "images": 16},
    ]
    (run / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "cpu"}, "epochs": epochs}))
    (run / "utilization").mkdir()
    pd.DataFrame({"time_s": [t + 0.01 * i for i in range(10)], "cpu_pct": 50.0}).to_csv(
        run / "utilization" / "host.csv", index=False
    )
    return run


def _python(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh Python; numpy (imported by the code before the command would say so) kept to one thread."""
    env = {"OPENBLAS_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
        env={**os.environ, **env},
    )


def _report(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stderr.strip().splitlines()[-1])


# What the command forked and in what order: the plot helper, the read, the helper let go.
COMMAND = """
import json, sys
from analysis import parallel
from analysis.parallel import plots
from analysis.read import xplane_wire as wire
from analysis.read import inputs
import analysis.pipeline as pipeline
if len(sys.argv) > 1 and sys.argv[1] == '--small-halved':
    sys.argv.pop(1)
    wire.CHUNK_EVENTS, wire.HALVES_MIN_EVENTS = 16, 0  # a small trace read as a large one is: begun, in two parts
events = []
real_start, real_go, real_read = plots.start, plots.PlotHelper.go, inputs.read_inputs

def start(*args, **kwargs):
    helper = real_start(*args, **kwargs)
    events.append(f"plot helper {helper is not None}")
    return helper

def go(self):
    if not self._going:
        events.append("go")
    real_go(self)

def read_inputs(*args, **kwargs):
    events.append("read")
    read = real_read(*args, **kwargs)
    events.append("read done")
    return read

plots.start, plots.PlotHelper.go, pipeline.read_inputs = start, go, read_inputs
from profiler import cli
code = cli.main(['analyze', *sys.argv[1:]])
print(json.dumps({'code': code, 'events': events, 'matplotlib': 'matplotlib' in sys.modules}), file=sys.stderr)
"""


@pytest.mark.slow  # starts subprocesses
def test_the_helper_draws_the_same_files_and_the_command_never_imports_matplotlib(tmp_path):
    run = _run_dir(tmp_path)
    helped = _python(COMMAND, str(run), "--out", str(tmp_path / "helped"))
    alone = _python(COMMAND, str(run), "--out", str(tmp_path / "alone"), env={parallel.ENV_VAR: "0"})
    assert _report(helped) == {
        "code": 0,
        "events": ["plot helper True", "read", "read done", "go"],
        "matplotlib": False,
    }, helped.stderr[-2000:]
    assert _report(alone) == {"code": 0, "events": ["plot helper False", "read", "read done"], "matplotlib": True}, (
        alone.stderr[-2000:]
    )
    names = sorted(p.name for p in (tmp_path / "alone").iterdir())
    assert {"step_breakdown.png", "epoch_breakdown.png", "utilization.png", "memory.csv"} <= set(names)
    assert sorted(p.name for p in (tmp_path / "helped").iterdir()) == names
    for name in names:
        assert (tmp_path / "helped" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes(), name
    assert helped.stdout.replace("helped", "alone") == alone.stdout


@pytest.mark.slow
def test_with_the_reads_own_child_the_helper_goes_when_that_child_has_ended(tmp_path):
    run = _run_dir(tmp_path)
    done = _python(COMMAND, "--small-halved", str(run), "--out", str(tmp_path / "out"))
    report = _report(done)
    assert report["code"] == 0 and not report["matplotlib"], done.stderr[-2000:]
    assert report["events"] == ["plot helper True", "read", "go", "read done"]
    assert (tmp_path / "out" / "step_breakdown.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_no_helper_where_no_files_are_written(tmp_path):
    trace = write_memory_trace(tmp_path / "host.xplane.pb").path
    done = _python(COMMAND, str(trace), "--format", "json")
    assert _report(done) == {"code": 0, "events": ["read", "read done"], "matplotlib": False}, done.stderr[-2000:]


@pytest.mark.slow
def test_a_plot_that_cannot_be_written_is_the_same_error(tmp_path):
    run = _run_dir(tmp_path)
    for name in ("helped", "alone"):
        (tmp_path / name / "step_breakdown.png").mkdir(parents=True)  # a folder where the PNG goes
    helped = _python(COMMAND, str(run), "--out", str(tmp_path / "helped"))
    alone = _python(COMMAND, str(run), "--out", str(tmp_path / "alone"), env={parallel.ENV_VAR: "0"})
    assert _report(helped)["code"] == _report(alone)["code"] == 1
    assert _report(helped)["events"][0] == "plot helper True"
    error = [line for line in helped.stderr.splitlines() if line.startswith("error:")]
    assert error and "cannot write the output files" in error[0]
    assert error == [line.replace("alone", "helped") for line in alone.stderr.splitlines() if line.startswith("error:")]


LOST_AND_UNUSED = """
import os, signal, sys
from analysis import parallel
unused = parallel.Helpers()
unused.start_plots()
pid = unused.plots.child.pid
unused.close()  # never asked to draw: ended and reaped at once
assert not os.path.exists(f'/proc/{pid}'), 'left a zombie or a live helper'
lost = parallel.Helpers()
lost.start_plots()
pid = lost.plots.child.pid
os.kill(pid, signal.SIGKILL)
import analysis
from analysis.render import outputs
result = analysis.analyze(sys.argv[1])
written = outputs.write_outputs(result, sys.argv[2], lost.draw)  # drawn here instead
assert not os.path.exists(f'/proc/{pid}')
print(sorted(p.name for p in written))
"""


@pytest.mark.slow
def test_a_lost_helper_is_drawn_here_and_an_unused_one_is_reaped(tmp_path):
    run = _run_dir(tmp_path)
    done = _python(LOST_AND_UNUSED, str(run), str(tmp_path / "out"), env={"OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step_breakdown.png" in done.stdout and "utilization.png" in done.stdout
    assert (tmp_path / "out" / "epoch_breakdown.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_helper_imports_matplotlib_without_its_3d_toolkit_and_says_nothing_of_it(tmp_path):
    done = _python(
        "import sys\nfrom analysis.parallel import plots\nplots.import_2d_matplotlib()\n"
        "from matplotlib.figure import Figure\n"
        "figure = Figure()\nfigure.add_subplot().plot([0, 1], [1, 0])\nfigure.savefig(sys.argv[1])\n"
        "print('mpl_toolkits.mplot3d.axes3d' in sys.modules, 'matplotlib.backends.backend_agg' in sys.modules)",
        str(tmp_path / "line.png"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
    assert "Axes3D" not in done.stderr and "3D" not in done.stderr, done.stderr
    assert (tmp_path / "line.png").read_bytes()[:4] == b"\x89PNG"


WAITING = """
import sys, time
import analysis
from analysis import parallel
from analysis.render import outputs

def matplotlib_in(pid):
    with open(f'/proc/{pid}/maps') as maps:
        return 'ft2font' in maps.read()  # one of matplotlib's compiled modules

result = analysis.analyze(sys.argv[1])
helpers = parallel.Helpers()
helpers.start_plots()
pid = helpers.plots.child.pid
time.sleep(0.5)
before = matplotlib_in(pid)
helpers.core_free()
helpers.core_free()  # once is enough; a second does nothing
deadline = time.monotonic() + 60
while not matplotlib_in(pid) and time.monotonic() < deadline:
    time.sleep(0.02)
after = matplotlib_in(pid)
helpers.close()
never_told = parallel.Helpers()
never_told.start_plots()  # asked to draw without a free core: drawing is one
written = outputs.write_outputs(result, sys.argv[2], never_told.draw)
print(before, after, 'matplotlib' in sys.modules, sorted(p.name for p in written if p.suffix == '.png'))
"""


@pytest.mark.slow
def test_a_waiting_helper_imports_nothing_until_a_core_is_free_or_it_is_asked_to_draw(tmp_path):
    run = _run_dir(tmp_path)
    done = _python(WAITING, str(run), str(tmp_path / "out"), env={"OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, here, pngs = done.stdout.split(" ", 3)
    assert (before, after, here) == ("False", "True", "False")
    assert pngs.strip() == "['epoch_breakdown.png', 'step_breakdown.png', 'utilization.png']"


def test_only_analysis_parallel_forks_and_no_stage_imports_it():
    import ast

    root = REPO / "analysis"
    stages = ("steps", "breakdown", "rules", "render", "comparison", "producers")
    forks = set()
    for path in [*root.rglob("*.py"), *(REPO / "profiler").rglob("*.py")]:
        text = path.read_text()
        if "os.fork" in text:
            forks.add(path.relative_to(REPO).parts[:2])
        if path.is_relative_to(root) and path.relative_to(root).parts[0] in stages:
            tree = ast.parse(text)
            imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
            imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            assert not any(name.startswith("analysis.parallel") for name in imported), path
    assert forks == {("analysis", "parallel")}, forks


def test_a_write_that_fails_before_the_plots_are_waited_for_still_ends_the_helper(tmp_path, monkeypatch, answers):
    from analysis.render import outputs

    result = pipeline.analyzed(
        write_prefetched_map_loop(tmp_path / "loop.xplane.pb", steps=8), None, helpers=parallel.Helpers(fork=False)
    )[0]

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "write_text_atomically", full_disk)
    with parallel.Helpers() as helpers:
        helpers.start_plots()
        assert helpers.plots is not None and _children()
        with pytest.raises(OSError, match="No space"):
            outputs.write_outputs(result, tmp_path / "out", helpers.draw)
    assert not _children()
