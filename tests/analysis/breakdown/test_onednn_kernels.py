"""oneDNN's implementation of each CPU op: oneDNN's own log (`onednn_verbose.log`) read and laid on
a hand-made trace whose op events and primitive executions have known times, and the names it
gives the op table's `kernel` column and the `below_roofline` finding."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import sys
import threading
import warnings

import pandas as pd
import pytest

from analysis.breakdown import onednn, roofline
from analysis.read.inputs import read_inputs
from analysis.read.onednn_log import ONEDNN_LOG, parse_onednn_log, read_onednn_log, trace_origin_ns
from analysis.worker import analyze_inputs
from trace_fixtures import NS_PER_MS, _Plane, _write_space, _xspace_class

ORIGIN_NS = 1_795_575_592_311_000_000  # the capture's start, ns since the epoch
LINE_NS = 1_000_000  # the lines' own start on the trace's clock
STEPS = 4
STEP_MS = 10
CONV = ("net/conv/Conv2D", "_MklNativeConv2D")  # 0.2 .. 4.2 ms of each step, thread 1
FILTER = ("net/conv/Conv2DBackpropFilter", "_MklNativeConv2DBackpropFilter")  # 4.2 .. 7.2 ms
RELU = ("net/relu/Relu", "Relu")  # 7.2 .. 8.2 ms: Eigen, no primitive
ADD = ("net/other/AddV2", "_MklAddV2")  # 1.0 .. 1.2 ms, thread 2, while the convolution runs


def _step_start(k: int) -> int:
    return LINE_NS + (1 + k * STEP_MS) * NS_PER_MS


def write_trace(path, origin_ns: int | None = ORIGIN_NS):
    space = _xspace_class()()
    space.hostnames.append("onednn-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", LINE_NS)
    one = host.line(101, "tf_Compute/1", LINE_NS)
    two = host.line(102, "tf_Compute/2", LINE_NS)
    for k in range(STEPS):
        t = _step_start(k)
        host.event(python, "IteratorGetNext", t, t + NS_PER_MS // 10, group_id=k)
        host.event(python, "EagerExecute", t + NS_PER_MS // 10, t + 9 * NS_PER_MS, group_id=k)
        at = t + NS_PER_MS // 5
        for (name, kind), ms in ((CONV, 4.0), (FILTER, 3.0), (RELU, 1.0)):
            end = at + int(ms * NS_PER_MS)
            host.event(one, f"{name}:{kind}", at, end, group_id=k)
            at = end
        host.event(two, f"{ADD[0]}:{ADD[1]}", t + NS_PER_MS, t + 12 * NS_PER_MS // 10, group_id=k)
        host.event(python, "TFE_DeleteTensorHandle", t + 9 * NS_PER_MS, t + 10 * NS_PER_MS, group_id=k)
    host.finish()
    environment = _Plane(space, 1, "Task Environment")
    if origin_ns is not None:
        stat = environment.plane.stats.add(metadata_id=environment._stat_id("profile_start_time"))
        stat.uint64_value = origin_ns
    return _write_space(space, path)


def _stamp(trace_ns: int) -> str:
    """oneDNN's stamp of an instant on the trace's clock: ms since the epoch, 6 decimals."""
    absolute = ORIGIN_NS + trace_ns
    return f"{absolute // 1_000_000}.{absolute % 1_000_000:06d}"


def _exec(trace_ns: int, primitive: str, implementation: str, prop: str, ms: float) -> str:
    return (
        f"onednn_verbose,v1,{_stamp(trace_ns)},primitive,exec,cpu,{primitive},{implementation},{prop},"
        f"src:f32::blocked:acdb::f0 wei:f32:a:blocked:Acdb8a::f0 dst:f32::blocked:acdb::f0,attr-scratchpad:user,"
        f"alg:convolution_direct,mb32_ic64oc128_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1,{ms:g}"
    )


HEADER = [
    "onednn_verbose,v1,info,oneDNN v3.7.3 (commit N/A)",
    "onednn_verbose,v1,info,cpu,isa:Intel AVX2",
    "onednn_verbose,v1,primitive,info,template:timestamp,operation,engine,primitive,implementation,prop_kind,"
    "memory_descriptors,attributes,auxiliary,problem_desc,exec_time",
]


def log_lines() -> list[str]:
    """Per step: the convolution's weight reorder (0.2 ms) and its brgemm forward convolution (2.5 ms,
    starting while thread 2's AddV2 runs, which holds its start but not its end); AddV2's binary
    primitive (0.1 ms, inside both ops: the innermost, AddV2, ran it); the weights' gradient on jit:avx2
    (2.0 ms) and a reorder after it (0.5 ms). Then lines that must be left out."""
    lines = list(HEADER)
    for k in range(STEPS):
        t = _step_start(k)
        conv, filt = t + NS_PER_MS // 5, t + 42 * NS_PER_MS // 10
        lines += [
            _exec(conv + 100_000, "reorder", "jit:uni", "undef", 0.2),
            _exec(t + NS_PER_MS, "convolution", "brg_conv_fwd:avx2", "forward_training", 2.5),
            _exec(t + NS_PER_MS + 50_000, "binary", "jit:uni", "undef", 0.1),
            _exec(filt + 100_000, "convolution", "jit:avx2", "backward_weights", 2.0),
            _exec(filt + 2_200_000, "reorder", "simple:any", "undef", 0.5),
        ]
    after = _step_start(STEPS) + 5 * NS_PER_MS
    lines += [
        _exec(after, "convolution", "gemm:jit", "forward_training", 3.0),  # outside every op: ignored
        _exec(_step_start(0) + NS_PER_MS // 2, "convolution", "gemm:ref", "forward_training", 0.1)[:60],  # cut short
        "onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,jit:avx2,forward_training,,,,mb1,0.5",
        "onednn_verbose,v1,abc.5,primitive,exec,cpu,convolution,gemm:ref,forward_training,,,,mb1,0.5",
        "Epoch 1/2",  # not oneDNN's
    ]
    return lines


def write_run(run, lines=None, origin_ns: int | None = ORIGIN_NS):
    """A run directory: run.json, the trace where devprof writes it, and oneDNN's log."""
    write_trace(run / "plugins" / "profile" / "session" / "onednn-host.xplane.pb", origin_ns)
    (run / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "cpu"}}))
    (run / ONEDNN_LOG).write_text("\n".join(log_lines() if lines is None else lines) + "\n")
    return run


def test_the_reader_keeps_only_timestamped_execution_lines_exactly(tmp_path):
    frame = parse_onednn_log("\n".join(log_lines()))
    assert len(frame) == STEPS * 5 + 1  # five per step and the one outside every op
    first = frame.iloc[1]
    assert first["at_ns"] == ORIGIN_NS + _step_start(0) + NS_PER_MS  # exact to the nanosecond the stamp gives
    assert (first["primitive"], first["implementation"], first["prop"], first["ms"]) == (
        "convolution",
        "brg_conv_fwd:avx2",
        "forward_training",
        2.5,
    )
    assert set(frame["implementation"]) == {"jit:uni", "brg_conv_fwd:avx2", "jit:avx2", "simple:any", "gemm:jit"}
    # oneDNN 2's lines (no version field, no "primitive,") read the same
    old = parse_onednn_log(
        "onednn_verbose,1795575592311.5,exec,cpu,matmul,brg:avx512_core,undef,src_f32,,,2x3:3x4,0.25"
    )
    assert list(old["at_ns"]) == [1_795_575_592_311_500_000] and list(old["implementation"]) == ["brg:avx512_core"]
    assert parse_onednn_log("").empty and list(parse_onednn_log("").columns) == list(frame.columns)


def test_a_run_without_the_log_reads_none_and_a_fifo_is_not_read(tmp_path):
    assert read_onednn_log(tmp_path) is None
    os.mkfifo(tmp_path / ONEDNN_LOG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_onednn_log(tmp_path) is None
    assert any("not a regular file" in str(w.message) for w in caught)


def test_the_trace_states_its_start(tmp_path):
    inputs = read_inputs(write_trace(tmp_path / "t.xplane.pb"))
    assert inputs.trace is not None
    assert trace_origin_ns(inputs.trace.trace) == ORIGIN_NS


def test_each_op_gets_the_implementation_of_its_main_primitive(tmp_path):
    inputs = read_inputs(write_run(tmp_path))
    assert inputs.onednn is not None and len(inputs.onednn) == STEPS * 5 + 1
    assert inputs.trace is not None
    analysis = analyze_inputs(inputs)
    kernels = analysis.ops.set_index("op")["kernel"]
    assert kernels[CONV[0]] == "oneDNN brg_conv_fwd:avx2"  # its convolution, not the reorder before it
    assert kernels[FILTER[0]] == "oneDNN jit:avx2"
    assert kernels[ADD[0]] == "oneDNN jit:uni"  # the binary primitive inside both ops is the innermost's
    assert kernels[RELU[0]] == "Eigen"
    table = onednn.op_implementations(inputs.trace, analysis.steps, inputs.onednn).set_index("op")
    # per step: the convolution's 2.5 ms (the 3 ms gemm:jit after the last step went to no op), 2.7 ms in all
    assert table.loc[CONV[0], "primitive_ms_per_step"] == pytest.approx(2.5)
    assert table.loc[CONV[0], "onednn_ms_per_step"] == pytest.approx(2.7)
    assert table.loc[FILTER[0], "onednn_ms_per_step"] == pytest.approx(2.5)
    assert table.loc[ADD[0], "onednn_ms_per_step"] == pytest.approx(0.1)
    assert "gemm:jit" not in set(table["implementation"]) and RELU[0] not in table.index


def test_without_the_log_or_the_traces_start_only_the_library_is_named(tmp_path):
    inputs = read_inputs(write_trace(tmp_path / "a" / "t.xplane.pb"))
    assert inputs.onednn is None
    assert analyze_inputs(inputs).ops.set_index("op")["kernel"][CONV[0]] == "oneDNN"
    inputs = read_inputs(write_run(tmp_path / "b", origin_ns=None))
    assert inputs.onednn is None  # no clock to lay the stamps on: nothing is guessed
    assert analyze_inputs(inputs).ops.set_index("op")["kernel"][FILTER[0]] == "oneDNN"


def test_an_eigen_op_is_named_by_onednn_only_where_onednn_holds_most_of_its_time(tmp_path):
    ops = pd.DataFrame(
        {"op": ["a", "b", "c"], "type": ["MatMul", "MatMul", "_MklMatMul"], "ms_per_step": [1.0, 1.0, 1.0]}
    )
    named = pd.DataFrame(
        {
            "op": ["a", "b", "c"],
            "type": ["MatMul", "MatMul", "_MklMatMul"],
            "primitive": ["matmul"] * 3,
            "implementation": ["gemm:jit", "gemm:jit", "brg:avx2"],
            "primitive_ms_per_step": [0.9, 0.1, 0.1],
            "onednn_ms_per_step": [0.9, 0.1, 0.1],
        }
    )
    assert list(roofline._kernels(ops, "cpu", named)) == ["oneDNN gemm:jit", "Eigen", "oneDNN brg:avx2"]


COSTS = pd.DataFrame(
    [
        {
            "function": "train_step",
            "op": CONV[0],
            "type": "Conv2D",
            "dtype": "float32",
            "kind": "matrix",
            "flops": 3.6e9,
            "bytes": 4e6,
            "flops_source": "tensorflow",
            "chain_flops": math.nan,
            "chain_bytes": math.nan,
        },
        {
            "function": "train_step",
            "op": FILTER[0],
            "type": "Conv2DBackpropFilter",
            "dtype": "float32",
            "kind": "matrix",
            "flops": 3e8,
            "bytes": 4e6,
            "flops_source": "formula",
            "chain_flops": math.nan,
            "chain_bytes": math.nan,
        },
    ]
)
CEILINGS = roofline.Ceilings(
    {"float32": {"matrix_flops_per_second": 1e12, "vector_flops_per_second": 1e11, "memory_bytes_per_second": 1e11}},
    "peak file",
)


@pytest.mark.parametrize("with_log", [True, False])
def test_below_roofline_names_the_implementation_and_says_what_it_means(tmp_path, with_log):
    trace = write_run(tmp_path) if with_log else write_trace(tmp_path / "t.xplane.pb")
    inputs = dataclasses.replace(read_inputs(trace), op_costs=COSTS)
    found = {f["rule"]: f for f in analyze_inputs(inputs, peak=CEILINGS).findings}
    finding = found["below_roofline"]
    # the weights' gradient: 3e8 FLOP in 3 ms = 1e11 FLOP/s, 10 % of its ceiling
    if with_log:
        assert "_MklNativeConv2DBackpropFilter, float32, oneDNN jit:avx2) runs at 10 %" in finding["evidence"]
        assert "oneDNN ran this Conv2DBackpropFilter with jit:avx2, not one of its brgemm kernels" in finding["advice"]
    else:
        assert "_MklNativeConv2DBackpropFilter, float32, oneDNN) runs at 10 %" in finding["evidence"]
        # a trace of the user's own program: no kernel log, no claim about oneDNN's kernels, no devprof run flag
        assert (
            "which oneDNN kernel ran this Conv2DBackpropFilter was not recorded (`ONEDNN_VERBOSE=1`"
            in finding["advice"]
        )
        assert "devprof run" not in finding["advice"] and "no faster kernel" not in finding["advice"]


# ---------------------------------------------------------------- devprof run --onednn-kernels: the diversion


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _wait_for(fd: int, end: bytes) -> bytes:
    """What `fd` gives until it ends with `end` (a minute at most: a bound on a hang, not a timing)."""
    shown = b""
    while not shown.endswith(end):
        ready, _, _ = select.select([fd], [], [], 60)
        assert ready, shown
        shown += os.read(fd, 65536)
    return shown


def test_onednns_lines_go_to_the_log_and_everything_else_to_stdout_unchanged(tmp_path):
    """A pipe stands for the real stdout: what the block writes to the descriptor at the C level."""
    from profiler.train.onednn_verbose import Diversion

    real_read, real_write = os.pipe()
    try:
        kept = _exec(NS_PER_MS, "convolution", "jit:avx2", "backward_weights", 2.0).encode() + b"\n"
        with Diversion(fd=real_write) as diversion:
            os.write(real_write, b"onednn_verbose,v1,info,before the log\nEpoch 1/2\n")  # before attach: dropped
            assert _wait_for(real_read, b"Epoch 1/2\n") == b"Epoch 1/2\n"  # the pump has read both lines
            diversion.attach(tmp_path / ONEDNN_LOG)
            os.write(real_write, HEADER[0].encode() + b"\n" + kept[:40])
            os.write(real_write, kept[40:] + b"onednn")  # a line split across writes, then an undecided start
            os.write(real_write, b"_verbose_is_not_a_marker\n")
            os.write(real_write, b"\r 3/10 [==>.....] - loss: 2.30")  # a progress bar: no newline
            # ... reaches the real stdout while the block still runs, not at its end
            shown = b"Epoch 1/2\n" + _wait_for(real_read, b"loss: 2.30")
            rest: list[bytes] = []
            reader = threading.Thread(target=lambda: rest.append(_read_all(real_read)))
            reader.start()  # the real stdout is read while the run writes, as a terminal is
            os.write(real_write, b"\n" + b"x" * 100_000 + b"\n")  # longer than a pipe's buffer
            os.write(real_write, b"onednn_verbose,v1,cut sho")  # the run ends mid-line
        os.close(real_write)
        real_write = -1
        reader.join()
        shown += rest[0]
    finally:
        os.close(real_read)
        if real_write >= 0:
            os.close(real_write)
    assert shown == (
        b"Epoch 1/2\nonednn_verbose_is_not_a_marker\n\r 3/10 [==>.....] - loss: 2.30\n" + b"x" * 100_000 + b"\n"
    )
    log = (tmp_path / ONEDNN_LOG).read_bytes()
    assert log == HEADER[0].encode() + b"\n" + kept + b"onednn_verbose,v1,cut sho"
    assert diversion.summary() == {
        "file": ONEDNN_LOG,
        "lines": 3,
        "bytes": len(log),
        "dropped_lines": 1,
        "capped": False,
    }
    assert len(parse_onednn_log(log.decode())) == 1


def test_the_log_stops_at_its_bound_and_after_the_trace(tmp_path):
    from profiler.train.onednn_verbose import Diversion, cap_warning

    real_read, real_write = os.pipe()
    early = _exec(NS_PER_MS, "convolution", "jit:avx2", "backward_weights", 2.0).encode() + b"\n"
    late = _exec(10_000 * NS_PER_MS, "convolution", "jit:avx2", "backward_weights", 2.0).encode() + b"\n"
    try:
        with Diversion(fd=real_write, max_bytes=3 * len(early)) as diversion:
            diversion.attach(tmp_path / ONEDNN_LOG)
            os.write(real_write, early * 2)
            diversion.keep_until((ORIGIN_NS + 5_000 * NS_PER_MS) / 1e9)  # the trace ended between the two
            os.write(real_write, late + HEADER[1].encode() + b"\n" + early * 2)
        os.close(real_write)
        real_write = -1
        assert _read_all(real_read) == b""
    finally:
        os.close(real_read)
        if real_write >= 0:
            os.close(real_write)
    # two early lines, the late one dropped, the header line kept, then the bound: one early line more fits no more
    assert (tmp_path / ONEDNN_LOG).read_bytes() == early * 2 + HEADER[1].encode() + b"\n"
    summary = diversion.summary()
    assert summary["capped"] and summary["lines"] == 3 and summary["dropped_lines"] == 3
    warning = cap_warning(summary, 3 * len(early))
    assert warning is not None
    assert "onednn_verbose.log reached" in warning


@pytest.mark.parametrize(
    "environ, modules, says",
    [
        ({}, {"tensorflow": object()}, "before TensorFlow is loaded"),
        ({"ONEDNN_VERBOSE": "all"}, {}, "it is set to 'all'"),
        ({"ONEDNN_VERBOSE_TIMESTAMP": "0"}, {}, "ONEDNN_VERBOSE_TIMESTAMP=1"),
        ({"TF_ENABLE_ONEDNN_OPTS": "0"}, {}, "turns them off"),
    ],
)
def test_onednn_kernels_is_refused_where_it_cannot_work(environ, modules, says):
    from profiler.train.onednn_verbose import problem

    said = problem(environ, modules)
    assert said is not None
    assert says in said
    assert problem({"ONEDNN_VERBOSE": "profile_exec", "TF_ENABLE_ONEDNN_OPTS": "1"}, {}) is None


@pytest.mark.parametrize(
    "extra, says", [(["--no-profile"], "needs the profile window"), (["--device", "gpu"], "names oneDNN's CPU kernels")]
)
def test_onednn_kernels_without_a_trace_or_on_a_device_is_exit_2(tmp_path, capsys, monkeypatch, extra, says):
    from profiler.cli import main

    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    for name in ("ONEDNN_VERBOSE", "ONEDNN_VERBOSE_TIMESTAMP", "TF_ENABLE_ONEDNN_OPTS"):
        monkeypatch.setenv(name, "")  # what the run sets is undone after the test
        monkeypatch.delenv(name)
    code = main(["run", "--onednn-kernels", "--out", str(tmp_path), "--data", "synthetic", *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and says in err and len(err.strip().splitlines()) == 1
