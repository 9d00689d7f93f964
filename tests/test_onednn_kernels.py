"""oneDNN's implementation of each CPU op: oneDNN's own log (`onednn_verbose.log`) read and laid on
a hand-made trace whose op events and primitive executions have known times, and the names it
gives the op table's `kernel` column and the `below_roofline` finding."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import pandas as pd
import pytest
from trace_fixtures import NS_PER_MS, _Plane, _write_space, _xspace_class

from analysis.breakdown import onednn, roofline
from analysis.pipeline import analyze_inputs
from analysis.read.inputs import read_inputs
from analysis.read.onednn_log import ONEDNN_LOG, parse_onednn_log, read_onednn_log, trace_origin_ns

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
    return (f"onednn_verbose,v1,{_stamp(trace_ns)},primitive,exec,cpu,{primitive},{implementation},{prop},"
            f"src:f32::blocked:acdb::f0 wei:f32:a:blocked:Acdb8a::f0 dst:f32::blocked:acdb::f0,attr-scratchpad:user,"
            f"alg:convolution_direct,mb32_ic64oc128_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1,{ms:g}")


HEADER = ["onednn_verbose,v1,info,oneDNN v3.7.3 (commit N/A)",
          "onednn_verbose,v1,info,cpu,isa:Intel AVX2",
          "onednn_verbose,v1,primitive,info,template:timestamp,operation,engine,primitive,implementation,prop_kind,"
          "memory_descriptors,attributes,auxiliary,problem_desc,exec_time"]


def log_lines() -> list[str]:
    """Per step: the convolution's weight reorder (0.2 ms) and its brgemm forward convolution (2.5 ms,
    starting while thread 2's AddV2 runs, which holds its start but not its end); AddV2's binary
    primitive (0.1 ms, inside both ops: the innermost, AddV2, ran it); the weights' gradient on jit:avx2
    (2.0 ms) and a reorder after it (0.5 ms). Then lines that must be left out."""
    lines = list(HEADER)
    for k in range(STEPS):
        t = _step_start(k)
        conv, filt = t + NS_PER_MS // 5, t + 42 * NS_PER_MS // 10
        lines += [_exec(conv + 100_000, "reorder", "jit:uni", "undef", 0.2),
                  _exec(t + NS_PER_MS, "convolution", "brg_conv_fwd:avx2", "forward_training", 2.5),
                  _exec(t + NS_PER_MS + 50_000, "binary", "jit:uni", "undef", 0.1),
                  _exec(filt + 100_000, "convolution", "jit:avx2", "backward_weights", 2.0),
                  _exec(filt + 2_200_000, "reorder", "simple:any", "undef", 0.5)]
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
    assert (first["primitive"], first["implementation"], first["prop"], first["ms"]) == \
        ("convolution", "brg_conv_fwd:avx2", "forward_training", 2.5)
    assert set(frame["implementation"]) == {"jit:uni", "brg_conv_fwd:avx2", "jit:avx2", "simple:any", "gemm:jit"}
    # oneDNN 2's lines (no version field, no "primitive,") read the same
    old = parse_onednn_log("onednn_verbose,1795575592311.5,exec,cpu,matmul,brg:avx512_core,undef,src_f32,,,2x3:3x4,0.25")
    assert list(old["at_ns"]) == [1_795_575_592_311_500_000] and list(old["implementation"]) == ["brg:avx512_core"]
    assert parse_onednn_log("").empty and list(parse_onednn_log("").columns) == list(frame.columns)


def test_a_run_without_the_log_reads_none_and_a_fifo_is_not_read(tmp_path):
    import os

    assert read_onednn_log(tmp_path) is None
    os.mkfifo(tmp_path / ONEDNN_LOG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_onednn_log(tmp_path) is None
    assert any("not a regular file" in str(w.message) for w in caught)


def test_the_trace_states_its_start(tmp_path):
    inputs = read_inputs(write_trace(tmp_path / "t.xplane.pb"))
    assert trace_origin_ns(inputs.trace.trace) == ORIGIN_NS


def test_each_op_gets_the_implementation_of_its_main_primitive(tmp_path):
    inputs = read_inputs(write_run(tmp_path))
    assert inputs.onednn is not None and len(inputs.onednn) == STEPS * 5 + 1
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
    ops = pd.DataFrame({"op": ["a", "b", "c"], "type": ["MatMul", "MatMul", "_MklMatMul"],
                        "ms_per_step": [1.0, 1.0, 1.0]})
    named = pd.DataFrame({"op": ["a", "b", "c"], "type": ["MatMul", "MatMul", "_MklMatMul"],
                          "primitive": ["matmul"] * 3, "implementation": ["gemm:jit", "gemm:jit", "brg:avx2"],
                          "primitive_ms_per_step": [0.9, 0.1, 0.1], "onednn_ms_per_step": [0.9, 0.1, 0.1]})
    assert list(roofline._kernels(ops, "cpu", named)) == ["oneDNN gemm:jit", "Eigen", "oneDNN brg:avx2"]


COSTS = pd.DataFrame([
    {"function": "train_step", "op": CONV[0], "type": "Conv2D", "dtype": "float32", "kind": "matrix", "flops": 3.6e9,
     "bytes": 4e6, "flops_source": "tensorflow", "chain_flops": math.nan, "chain_bytes": math.nan},
    {"function": "train_step", "op": FILTER[0], "type": "Conv2DBackpropFilter", "dtype": "float32", "kind": "matrix",
     "flops": 3e8, "bytes": 4e6, "flops_source": "formula", "chain_flops": math.nan, "chain_bytes": math.nan},
])
CEILINGS = roofline.Ceilings({"float32": {"matrix_flops_per_second": 1e12, "vector_flops_per_second": 1e11,
                                          "memory_bytes_per_second": 1e11}}, "peak file")


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
        assert "devprof run --onednn-kernels names the implementation" in finding["advice"]
