"""Round four of hostile inputs: files that are not traces, whatever their size."""

from __future__ import annotations

import os
import re

import pytest

import analysis
from analysis.read.trace import TraceError
from marker_traces import BASE_NS, MS
from repo_paths import REPO


def _marked_trace(tmp_path, second_line: str, step, steps: int = 6):
    """A CPU trace of `steps` 10 ms steps with `train` markers; `step(host, python, other, t)` adds each
    step's events on the Python thread and on a second thread named `second_line`."""
    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    space.hostnames.append("host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    other = host.line(101, second_line, BASE_NS)
    for k in range(steps):
        t = BASE_NS + 10 * MS + k * 10 * MS
        host.event(python, "train", t, t + 10 * MS, step_num=k, _r=1)
        step(host, python, other, t)
    host.finish()
    return _write_space(space, tmp_path / "t.xplane.pb")


def _sparse(path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)  # no data written: a file of zeros that takes no disk


@pytest.mark.parametrize("size", [4096, 3 * 2**30])
def test_a_file_of_zeros_of_any_size_is_refused_at_its_first_byte(tmp_path, size):
    trace = tmp_path / "z.xplane.pb"
    _sparse(trace, size)
    with pytest.raises(TraceError, match=r"field number 0 at byte 0: not a protobuf message"):
        analysis.analyze(trace)


def test_a_file_whose_top_level_is_no_xspace_is_refused_before_it_is_decoded(tmp_path):
    trace = tmp_path / "t.xplane.pb"
    # A well-formed first field (planes, empty), then field 9: no XSpace has it. Then 64 MiB of zeros
    # that the decoder would otherwise walk.
    with open(trace, "wb") as handle:
        handle.write(bytes([0x0A, 0x00, (9 << 3) | 2, 0x01, 0x41]))
        handle.truncate(64 * 2**20)
    with pytest.raises(TraceError, match=r"field 9 \(wire type 2\) at the top level: not an XSpace trace"):
        analysis.analyze(trace)
    assert os.path.getsize(trace) == 64 * 2**20


@pytest.mark.parametrize("cell", [("step_ms", "1e300"), ("call_ms", "1e12"), ("images", "1e30"),
                                  ("start_time_s", "1e200")])
def test_one_absurd_steps_csv_row_is_dropped_with_a_warning_not_the_analysis(tmp_path, cell):
    from analysis.read.run_files import RunFileWarning
    from run_fixtures import make_run, step_line

    column, value = cell
    lines = [step_line(i) for i in range(8)]
    header = "epoch,step,steps,start_time_s,input_ms,call_ms,other_host_ms,step_ms,images".split(",")
    cells = lines[5].split(",")
    cells[header.index(column)] = value
    lines[5] = ",".join(cells)
    run = make_run(tmp_path / "run", lines)
    with pytest.warns(RunFileWarning, match=r"skipped 1 of 8 rows"):
        result = analysis.analyze(run)
    assert len(result.steps) == 7 and result.mean["step_ms"] == pytest.approx(10.0)


def test_no_two_modules_of_the_profiler_import_each_other():
    """An import circle (`profiler/train/hooks.py` <-> `profiler/train/run.py`, once only for typing) makes which
    module loads first matter; `hooks` now names what it needs as a Protocol."""
    import ast
    from pathlib import Path

    root = REPO
    modules = {}
    for path in (root / "profiler").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("profiler"):
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name.startswith("profiler")}
        modules[name] = imported - {name}
    circles = {tuple(sorted((a, b))) for a, imported in modules.items() for b in imported
               if b in modules and a in modules[b] and not (a.startswith(b + ".") or b.startswith(a + "."))}
    assert not circles, circles


def test_a_step_name_that_matches_an_op_is_refused_naming_the_markers(tmp_path):
    def step(host, python, worker, t):
        host.event(python, "IteratorGetNext", t, t + 2 * MS)
        host.event(worker, "model/conv2d/Relu:_MklNativeFusedConv2D", t + 2 * MS, t + 7 * MS)

    trace = _marked_trace(tmp_path, "tf_Compute/1", step)
    # one execution of one op is no step (every other op would read as host overhead): refused, the
    # trace's own steps named
    with pytest.raises(TraceError, match=r"--step-name 'Conv2D' matches a TensorFlow op "
                                         r"\(model/conv2d/Relu:_MklNativeFusedConv2D\), not a step; .*train"):
        analysis.analyze(trace, step_name="Conv2D")
    from profiler.cli import main

    assert main(["analyze", str(trace), "--step-name", "Conv2D"]) != 0


@pytest.mark.parametrize("command", ["run", "capture"])
def test_help_shows_each_default_once_and_none_for_switches(capsys, command):
    from profiler import cli

    assert cli.main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    # "--no-profile ... (default: True)" read as "profiling is off by default".
    assert "(default: True)" not in text and "(default: False)" not in text and "(default: None)" not in text
    assert not re.search(r"\(default: [^)]*\)\s*\(default:", text), text
    if command == "run":
        assert "--no-profile no profiler window --profile-steps" in text
        assert "seconds between samples (minimum 0.05) (default: 0.5)" in text


def test_markdown_leaves_out_what_a_cpu_trace_does_not_record(tmp_path):
    from marker_traces import marker_trace

    result = analysis.analyze(marker_trace(tmp_path / "t.xplane.pb"))
    assert result.mean["device_step_ms"] != result.mean["device_step_ms"]  # NaN: no device on this CPU trace
    text = result.render("markdown")
    assert "device_step_ms" not in text and "| nan" not in text and "nan |" not in text


def test_an_output_under_a_missing_folder_creates_only_the_last_folder(tmp_path, capsys):
    from profiler import cli
    from marker_traces import marker_trace

    trace = marker_trace(tmp_path / "t.xplane.pb")
    assert cli.main(["analyze", str(trace), "-o", str(tmp_path / "new" / "r.md")]) == 0
    assert (tmp_path / "new" / "r.md").is_file()
    code = cli.main(["analyze", str(trace), "-o", str(tmp_path / "missing" / "deeper" / "r.md")])
    err = capsys.readouterr().err
    assert code != 0 and "error: cannot write" in err and "No such file or directory" in err, err
    assert not (tmp_path / "missing").exists()


def test_run_files_that_are_no_regular_files_are_named_not_skipped_in_silence(tmp_path, capsys):
    from profiler import cli
    from run_fixtures import make_run, step_line

    linked = make_run(tmp_path / "linked", [step_line(i) for i in range(6)])
    (linked / "run.json").unlink()
    (linked / "run.json").symlink_to("/dev/zero")
    fifo = make_run(tmp_path / "fifo", [step_line(i) for i in range(6)])
    (fifo / "steps.csv").unlink()
    os.mkfifo(fifo / "steps.csv")
    assert cli.main(["analyze", str(linked)]) != 0
    assert "run.json (a character device): not a regular file, not read" in capsys.readouterr().err
    assert cli.main(["analyze", str(fifo)]) != 0
    assert "steps.csv (a FIFO): not a regular file, not read" in capsys.readouterr().err
    cli.main(["compare", str(linked), str(fifo)])
    err = capsys.readouterr().err
    assert f"{linked} (run.json (a character device))" in err and "steps.csv (a FIFO): not a regular file" in err, err


def test_an_xla_compiled_step_on_a_cpu_shows_its_programs_instructions_as_ops(tmp_path):
    """`--jit-compile` on a CPU: the op table was the function call alone (or two trivial ops);
    XLA's CPU runtime records each instruction inside `ThunkExecutor::Execute`."""

    def step(host, python, pool, t):
        host.event(python, "IteratorGetNext", t, t + 1 * MS)
        host.event(python, "__inference_step_9:__inference_step_9", t + 1 * MS, t + 9 * MS)
        host.event(python, "ThunkExecutor::Execute", t + 1 * MS, t + 9 * MS)
        host.event(python, "convolution.1", t + 1 * MS, t + 5 * MS)
        host.event(python, "end: convolution.1", t + 5 * MS, t + 5 * MS)
        host.event(python, "transpose_copy_fusion", t + 5 * MS, t + 6 * MS)
        host.event(pool, "ThunkExecutor::Execute", t + 6 * MS, t + 9 * MS)
        host.event(pool, "MatMul.4", t + 6 * MS, t + 8 * MS)

    result = analysis.analyze(_marked_trace(tmp_path, "tf_numa_-1_Eigen/1", step))
    ops = result.ops.set_index("op")
    assert list(ops.index[:3]) == ["convolution.1", "MatMul.4", "transpose_copy_fusion"], result.ops
    assert ops.loc["convolution.1", "ms_per_step"] == pytest.approx(4.0) and set(ops["type"]) == {"XLA"}
    assert not any(op.startswith(("__inference", "end: ", "ThunkExecutor")) for op in ops.index)


def test_a_reader_that_closes_the_pipe_early_ends_devprof_quietly(tmp_path, capsys, monkeypatch):
    """`devprof analyze ... | head`: 'error: analyze failed: BrokenPipeError' was printed."""
    from profiler import cli

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.build_parser()
    parser._subparsers._group_actions[0].choices["analyze"].set_defaults(handler=closed_pipe)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(cli, "_stdout_to_devnull", lambda: None)  # pytest's own stdout stays as it is
    assert cli.main(["analyze", str(tmp_path / "t.xplane.pb")]) == cli.EXIT_BROKEN_PIPE
    assert "error" not in capsys.readouterr().err


def test_the_epoch_line_leaves_out_metrics_the_run_does_not_compute():
    """`--dataset` runs have no validation data: they printed 'val_loss: nan - val_accuracy: nan'."""
    import io
    import math

    from models.training import EpochResult
    from profiler.record.console import Console

    stream = io.StringIO()
    console = Console(False, stream=stream)
    console.epoch_end(EpochResult(1, 3.0, 2.9, 100, 34.5, 0.25, 0.5, math.nan, math.nan, steps=10))
    line = stream.getvalue().strip()
    assert "nan" not in line and "loss: 0.2500 - accuracy: 0.5000" in line and "val_" not in line, line
    stream.truncate(0)
    console.epoch_end(EpochResult(1, 3.0, 2.9, 100, 34.5, 0.25, 0.5, 0.75, 0.4, steps=10))
    assert "val_loss: 0.7500 - val_accuracy: 0.4000" in stream.getvalue()
