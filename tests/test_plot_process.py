"""`devprof analyze` draws its PNGs in a helper process: the same files, matplotlib never imported by
the command itself, errors reported as before, and a helper that is lost or unused leaves nothing behind.

The helper starts only in a process with one thread, which a pytest process is not (numpy's): each
test runs the command in a fresh Python.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from memory_fixtures import write_memory_trace

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # starts subprocesses


def _run_dir(root: Path) -> Path:
    """A run directory (trace with allocator events, steps.csv, run.json, a host sampler): every PNG and CSV."""
    run = root / "run"
    write_memory_trace(run / "plugins" / "profile" / "s1" / "host.xplane.pb", steps=4)
    t = 1_700_000_000.0
    rows = [dict(epoch=1 + step // 2, step=step, steps=1, start_time_s=t + 0.02 * step, input_ms=1.0, call_ms=10.0,
                 other_host_ms=0.5, step_ms=11.5, images=8) for step in range(4)]
    pd.DataFrame(rows).to_csv(run / "steps.csv", index=False)
    epochs = [{"epoch": 1, "seconds": 0.05, "train_seconds": 0.04, "images": 16},
              {"epoch": 2, "seconds": 0.05, "train_seconds": 0.04, "images": 16}]
    (run / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "cpu"}, "epochs": epochs}))
    (run / "utilization").mkdir()
    pd.DataFrame({"time_s": [t + 0.01 * i for i in range(10)], "cpu_pct": 50.0}).to_csv(
        run / "utilization" / "host.csv", index=False)
    return run


def _python(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=180,
                          env={**os.environ, **(env or {})})


COMMAND = """
import json, sys
from analysis.render import plot_process
started = []
real_start = plot_process.start
def start(*args, **kwargs):
    helper = real_start(*args, **kwargs)
    started.append(helper is not None)
    return helper
plot_process.start = start
from profiler import cli
code = cli.main(['analyze', *sys.argv[1:]])
print(json.dumps({'code': code, 'helper': started, 'matplotlib': 'matplotlib' in sys.modules}), file=sys.stderr)
"""


def _report(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_the_helper_draws_the_same_files_and_the_command_never_imports_matplotlib(tmp_path):
    run = _run_dir(tmp_path)
    helped = _python(COMMAND, str(run), "--out", str(tmp_path / "helped"))
    alone = _python(COMMAND, str(run), "--out", str(tmp_path / "alone"), env={"DEVPROF_PLOT_PROCESS": "0"})
    assert _report(helped) == {"code": 0, "helper": [True], "matplotlib": False}, helped.stderr[-2000:]
    assert _report(alone) == {"code": 0, "helper": [False], "matplotlib": True}, alone.stderr[-2000:]
    names = sorted(p.name for p in (tmp_path / "alone").iterdir())
    assert {"step_breakdown.png", "epoch_breakdown.png", "utilization.png", "memory.csv"} <= set(names)
    assert sorted(p.name for p in (tmp_path / "helped").iterdir()) == names
    for name in names:
        assert (tmp_path / "helped" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes(), name
    assert helped.stdout.replace("helped", "alone") == alone.stdout


def test_no_helper_where_no_files_are_written(tmp_path):
    trace = write_memory_trace(tmp_path / "host.xplane.pb").path
    done = _python(COMMAND, str(trace), "--format", "json")
    assert _report(done) == {"code": 0, "helper": [], "matplotlib": False}, done.stderr[-2000:]


def test_a_plot_that_cannot_be_written_is_the_same_error(tmp_path):
    run = _run_dir(tmp_path)
    for name in ("helped", "alone"):
        (tmp_path / name / "step_breakdown.png").mkdir(parents=True)  # a folder where the PNG goes
    helped = _python(COMMAND, str(run), "--out", str(tmp_path / "helped"))
    alone = _python(COMMAND, str(run), "--out", str(tmp_path / "alone"), env={"DEVPROF_PLOT_PROCESS": "0"})
    assert _report(helped)["code"] == _report(alone)["code"] == 1
    assert _report(helped)["helper"] == [True]
    error = [line for line in helped.stderr.splitlines() if line.startswith("error:")]
    assert error and "cannot write the output files" in error[0]
    assert error == [line.replace("alone", "helped") for line in alone.stderr.splitlines() if line.startswith("error:")]


LOST_AND_UNUSED = """
import os, signal, sys
from analysis.render import plot_process
unused = plot_process.start()
assert unused is not None
unused.close()  # never asked to draw: ended and reaped at once
assert not os.path.exists(f'/proc/{unused.pid}'), 'left a zombie or a live helper'
lost = plot_process.start()
os.kill(lost.pid, signal.SIGKILL)
import analysis
from analysis.render import outputs
result = analysis.analyze(sys.argv[1])
written = outputs.write_outputs(result, sys.argv[2], lost)  # drawn here instead
assert not os.path.exists(f'/proc/{lost.pid}')
print(sorted(p.name for p in written))
"""


def test_a_lost_helper_is_drawn_here_and_an_unused_one_is_reaped(tmp_path):
    run = _run_dir(tmp_path)
    done = _python(LOST_AND_UNUSED, str(run), str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step_breakdown.png" in done.stdout and "utilization.png" in done.stdout
    assert (tmp_path / "out" / "epoch_breakdown.png").read_bytes()[:4] == b"\x89PNG"


def test_no_helper_in_a_process_with_other_threads():
    done = _python("import numpy, threading, time\n"
                   "threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
                   "from analysis.render import plot_process\nprint(plot_process.start())")
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr


def test_the_helper_imports_matplotlib_without_its_3d_toolkit_and_says_nothing_of_it(tmp_path):
    done = _python("import sys\nfrom analysis.render import plot_process\nplot_process.import_2d_matplotlib()\n"
                   "from matplotlib.figure import Figure\n"
                   "figure = Figure()\nfigure.add_subplot().plot([0, 1], [1, 0])\nfigure.savefig(sys.argv[1])\n"
                   "print('mpl_toolkits.mplot3d.axes3d' in sys.modules, 'matplotlib.backends.backend_agg' in sys.modules)",
                   str(tmp_path / "line.png"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
    assert "Axes3D" not in done.stderr and "3D" not in done.stderr, done.stderr
    assert (tmp_path / "line.png").read_bytes()[:4] == b"\x89PNG"


WAITING = """
import sys, time
import analysis
from analysis.render import outputs, plot_process

def matplotlib_in(pid):
    with open(f'/proc/{pid}/maps') as maps:
        return 'ft2font' in maps.read()  # one of matplotlib's compiled modules

result = analysis.analyze(sys.argv[1])
helper = plot_process.start(wait=True)
time.sleep(0.5)
before = matplotlib_in(helper.pid)
helper.go()
helper.go()  # once is enough; a second does nothing
deadline = time.monotonic() + 60
while not matplotlib_in(helper.pid) and time.monotonic() < deadline:
    time.sleep(0.02)
after = matplotlib_in(helper.pid)
helper.close()
never_told = plot_process.start(wait=True)  # asked to draw without a go: drawing is one
written = outputs.write_outputs(result, sys.argv[2], never_told)
print(before, after, 'matplotlib' in sys.modules, sorted(p.name for p in written if p.suffix == '.png'))
"""


def test_a_waiting_helper_imports_nothing_until_it_is_told_to_go_or_asked_to_draw(tmp_path):
    run = _run_dir(tmp_path)
    done = _python(WAITING, str(run), str(tmp_path / "out"), env={"OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, here, pngs = done.stdout.split(" ", 3)
    assert (before, after, here) == ("False", "True", "False")
    assert pngs.strip() == "['epoch_breakdown.png', 'step_breakdown.png', 'utilization.png']"


ORDER = """
import json, sys
from analysis.read import xplane_wire as wire
from analysis.render import plot_process
import analysis.pipeline as pipeline
wire.CHUNK_EVENTS, wire.HALVES_MIN_EVENTS = 16, 0  # a small trace read as a large one is: begun, in two parts
events = []
real_start, real_go, real_read = plot_process.start, plot_process.PlotProcess.go, pipeline.read_inputs

def start(*args, **kwargs):
    events.append(f"start wait={kwargs.get('wait', False)}")
    return real_start(*args, **kwargs)

def go(self):
    if self._waiting:
        events.append("go")
    real_go(self)

def read_inputs(*args):
    events.append("read")
    inputs = real_read(*args)
    events.append("read done")
    return inputs

plot_process.start, plot_process.PlotProcess.go, pipeline.read_inputs = start, go, read_inputs
from profiler import cli
code = cli.main(['analyze', *sys.argv[1:]])
print(json.dumps({'code': code, 'events': events, 'matplotlib': 'matplotlib' in sys.modules}), file=sys.stderr)
"""


@pytest.mark.parametrize("fork", ["1", "0"])
def test_the_command_forks_the_helper_before_the_read_and_lets_it_go_once_a_core_is_free(tmp_path, fork):
    """With the read's own child, the helper goes when that child has ended, while the read finishes here;
    without one, once the trace is read."""
    run = _run_dir(tmp_path)
    # numpy is imported before the command sets this, which keeps its BLAS from starting threads
    done = _python(ORDER, str(run), "--out", str(tmp_path / "out"), env={"DEVPROF_FORK": fork, "OPENBLAS_NUM_THREADS": "1"})
    report = _report(done)
    assert report["code"] == 0 and not report["matplotlib"], done.stderr[-2000:]
    assert report["events"] == (["start wait=True", "read", "go", "read done"] if fork == "1"
                                else ["start wait=True", "read", "read done", "go"])
    assert (tmp_path / "out" / "step_breakdown.png").read_bytes()[:4] == b"\x89PNG"
