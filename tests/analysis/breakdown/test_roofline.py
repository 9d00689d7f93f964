"""The roofline per op: costs joined onto the op table, ceilings per dtype, the bound and the share
of the ceiling, the `below_roofline` finding and MFU, on hand-made traces with known times."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.breakdown import roofline
from analysis.read.inputs import read_inputs
from analysis.worker import analyze_inputs
from trace_fixtures import NS_PER_MS, _Plane, _write_space, _xspace_class

BASE_NS = 1_700_000_000_000_000_000
STEPS = 6
# op name, trace type, ms per step: the times the trace holds in every step
OPS = [
    ("net/conv2/Conv2DBackpropFilter", "_MklConv2DBackpropFilter", 4.0),
    ("net/conv2/BiasAdd", "_MklFusedConv2D", 2.0),
    ("net/relu/Relu", "Relu", 1.0),
    ("net/mystery/Op", "Mystery", 1.0),
]


def _costs(**overrides) -> pd.DataFrame:
    rows = [
        {
            "function": "train_step",
            "op": "net/conv2/Conv2DBackpropFilter",
            "type": "Conv2DBackpropFilter",
            "dtype": "float32",
            "kind": "matrix",
            "flops": 4e8,
            "bytes": 4e6,
            "flops_source": "formula",
            "chain_flops": math.nan,
            "chain_bytes": math.nan,
        },
        {
            "function": "train_step",
            "op": "net/conv2/Conv2D",
            "type": "Conv2D",
            "dtype": "float32",
            "kind": "matrix",
            "flops": 3e8,
            "bytes": 3e6,
            "flops_source": "tensorflow",
            "chain_flops": math.nan,
            "chain_bytes": math.nan,
        },
        {
            "function": "train_step",
            "op": "net/conv2/BiasAdd",
            "type": "BiasAdd",
            "dtype": "float32",
            "kind": "vector",
            "flops": 1e6,
            "bytes": 8e6,
            "flops_source": "tensorflow",
            "chain_flops": 3.01e8,
            "chain_bytes": 5e6,
        },
        {
            "function": "train_step",
            "op": "net/relu/Relu",
            "type": "Relu",
            "dtype": "float32",
            "kind": "vector",
            "flops": 1e6,
            "bytes": 8e6,
            "flops_source": "formula",
            "chain_flops": math.nan,
            "chain_bytes": math.nan,
        },
        # the evaluation step names the same op with another batch: the train step covers more of the trace's ops
        {
            "function": "eval_step",
            "op": "net/relu/Relu",
            "type": "Relu",
            "dtype": "float32",
            "kind": "vector",
            "flops": 9e9,
            "bytes": 9e9,
            "flops_source": "formula",
            "chain_flops": math.nan,
            "chain_bytes": math.nan,
        },
    ]
    frame = pd.DataFrame(rows)
    for key, value in overrides.items():
        frame[key] = value
    return frame


def write_op_trace(path, ops=OPS) -> Path:
    """CPU trace: STEPS steps (XProf group ids) of 10 ms, each running `ops` on a tf_Compute thread."""
    space = _xspace_class()()
    space.hostnames.append("roof-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    worker = host.line(101, "tf_Compute/1", BASE_NS)
    first = BASE_NS + 10 * NS_PER_MS
    for k in range(STEPS):
        t = first + k * 10 * NS_PER_MS
        host.event(python, "IteratorGetNext", t, t + NS_PER_MS // 10, group_id=k)
        host.event(python, "EagerExecute", t + NS_PER_MS // 10, t + 9 * NS_PER_MS, group_id=k)
        at = t + NS_PER_MS // 5
        for name, kind, ms in ops:
            end = at + int(ms * NS_PER_MS)
            host.event(worker, f"{name}:{kind}", at, end, group_id=k)
            at = end
        host.event(python, "TFE_DeleteTensorHandle", t + 9 * NS_PER_MS, t + 10 * NS_PER_MS, group_id=k)
    host.finish()
    return _write_space(space, path)


CEILINGS = roofline.Ceilings(
    {"float32": {"matrix_flops_per_second": 4e11, "vector_flops_per_second": 5e10, "memory_bytes_per_second": 1e10}},
    "peak file",
)


def _analysis(tmp_path, costs=None, peak=CEILINGS):
    inputs = read_inputs(write_op_trace(tmp_path / "roof.xplane.pb"))
    inputs = dataclasses.replace(inputs, op_costs=_costs() if costs is None else costs)
    return analyze_inputs(inputs, peak=peak)


def _row(analysis, op):
    return analysis.ops.set_index("op").loc[op]


def test_each_op_gets_its_costs_per_step_and_achieved_rate(tmp_path):
    analysis = _analysis(tmp_path)
    conv = _row(analysis, "net/conv2/Conv2DBackpropFilter")
    # oneDNN's _MklConv2DBackpropFilter is the graph's Conv2DBackpropFilter: 4e8 FLOP in 4 ms
    assert conv["flops_per_step"] == pytest.approx(4e8)
    assert conv["bytes_per_step"] == pytest.approx(4e6)
    assert conv["flops_per_second"] == pytest.approx(1e11, rel=1e-6)
    assert conv["intensity"] == pytest.approx(100.0)
    assert conv["kind"] == "matrix" and conv["dtype"] == "float32" and conv["kernel"] == "oneDNN"
    fused = _row(analysis, "net/conv2/BiasAdd")  # named after the chain's last node: the chain's costs
    assert fused["flops_per_step"] == pytest.approx(3.01e8) and fused["bytes_per_step"] == pytest.approx(5e6)
    assert fused["kind"] == "matrix"
    relu = _row(analysis, "net/relu/Relu")  # the train step's row, not the evaluation step's
    assert relu["flops_per_step"] == pytest.approx(1e6)
    mystery = _row(analysis, "net/mystery/Op")
    assert math.isnan(mystery["flops_per_step"]) and mystery["bound"] == "" and math.isnan(mystery["ceiling_pct"])


def test_bound_and_share_of_the_ceiling_follow_the_ridge_point(tmp_path):
    analysis = _analysis(tmp_path)
    # matrix ridge = 4e11 / 1e10 = 40 FLOP/byte. The backprop: intensity 100, compute-bound, 1e11 of 4e11.
    conv = _row(analysis, "net/conv2/Conv2DBackpropFilter")
    assert conv["bound"] == "compute" and conv["ceiling_pct"] == pytest.approx(25.0)
    # fused conv: intensity 60.2 > 40, 3.01e8 FLOP in 2 ms = 1.505e11 of 4e11
    fused = _row(analysis, "net/conv2/BiasAdd")
    assert fused["bound"] == "compute" and fused["ceiling_pct"] == pytest.approx(37.625)
    # relu: intensity 1e6/8e6 = 0.125 < vector ridge 5; roof = 1e10 * 0.125 = 1.25e9; achieved 1e6 FLOP in 1 ms = 1e9
    relu = _row(analysis, "net/relu/Relu")
    assert relu["bound"] == "memory" and relu["ceiling_pct"] == pytest.approx(80.0)


def test_the_finding_names_the_ops_far_below_their_ceiling(tmp_path):
    analysis = _analysis(tmp_path)
    found = {f["rule"]: f for f in analysis.findings}
    assert "below_roofline" in found
    evidence = found["below_roofline"]["evidence"]
    assert evidence.startswith(
        "net/conv2/Conv2DBackpropFilter (_MklConv2DBackpropFilter, float32, oneDNN) runs at 25 % of its compute ceiling"
    )
    assert "net/conv2/BiasAdd 38 % of its ceiling" in evidence and "Relu" not in evidence  # relu is at 80 %
    # no kernel log: which oneDNN kernel ran it is unknown, and said so, never "no faster kernel"
    assert "which oneDNN kernel ran this Conv2DBackpropFilter was not recorded" in found["below_roofline"]["advice"]


def test_no_finding_when_every_op_is_near_its_ceiling(tmp_path):
    slow_peak = roofline.Ceilings(
        {
            "float32": {
                "matrix_flops_per_second": 1.2e11,
                "vector_flops_per_second": 5e10,
                "memory_bytes_per_second": 1e10,
            }
        },
        "peak file",
    )
    analysis = _analysis(tmp_path, peak=slow_peak)
    assert _row(analysis, "net/conv2/Conv2DBackpropFilter")["ceiling_pct"] == pytest.approx(100 / 1.2)
    assert "below_roofline" not in {f["rule"] for f in analysis.findings}


def test_the_achieved_rate_and_mfu_cover_only_the_costed_ops_time(tmp_path):
    analysis = _analysis(tmp_path)
    roof = analysis.roofline
    assert roof["flops_per_step"] == pytest.approx(4e8 + 3.01e8 + 1e6)
    assert roof["known_time_pct"] == pytest.approx(100 * 7 / 8)
    # the costed ops ran 7 ms of each 10 ms step; the mystery op's 1 ms and its FLOPs are not guessed
    assert roof["achieved_flops_per_second"] == pytest.approx(roof["flops_per_step"] / 7e-3, rel=1e-6)
    assert roof["achieved_over"] == "over 88 % of op time that has known costs"
    assert roof["mfu_pct"] == pytest.approx(100 * roof["achieved_flops_per_second"] / 4e11)
    assert roof["dtype"] == "float32" and roof["ceilings_source"] == "peak file"
    assert analysis.facts.mfu_pct == pytest.approx(roof["mfu_pct"])
    line = next(line for line in analysis.render("text").splitlines() if line.startswith("roofline: 702 MFLOP"))
    assert "100 GFLOP/s achieved over 88 % of op time that has known costs, 25.1 % of the float32 matrix" in line
    assert analysis.to_json()["roofline"]["achieved_over"] == roof["achieved_over"]


def test_a_ceiling_below_the_achieved_rate_is_refused_with_one_warning(tmp_path):
    from analysis.read.run_files import RunFileWarning

    low = roofline.ceilings_from_tflops(roofline.parse_peak_tflops("0.001"))  # the ops reach 0.1 TFLOP/s
    with pytest.warns(RunFileWarning) as caught:
        analysis = _analysis(tmp_path, peak=low)
    said = "the ceiling 0.001 TFLOP/s for float32 is below the achieved 0.1 TFLOP/s: not used"
    assert [str(w.message) for w in caught] == [f"roofline: {said}"]
    roof = analysis.roofline
    assert math.isnan(roof["mfu_pct"]) and math.isnan(roof["ceilings"]["float32"]["matrix_flops_per_second"])
    assert analysis.ops["ceiling_pct"].isna().all()
    assert roof["notes"] == [said]  # not "no measured peak": one was given, and refused
    text = analysis.render("text")
    assert f"roofline: {said}" in text and "% of the float32 matrix ceiling" not in text
    # a vector ceiling the vector ops beat goes too; the matrix one they do not beat stays
    slow_vector = roofline.Ceilings(
        {"float32": {"matrix_flops_per_second": 4e11, "vector_flops_per_second": 1e8, "memory_bytes_per_second": 1e10}},
        "peak file",
    )
    with pytest.warns(
        RunFileWarning,
        match="the vector ceiling 0.0001 TFLOP/s for float32 is below the achieved 0.001 TFLOP/s: not used",
    ):
        analysis = _analysis(tmp_path, peak=slow_vector)
    assert math.isnan(_row(analysis, "net/relu/Relu")["ceiling_pct"])
    assert _row(analysis, "net/conv2/Conv2DBackpropFilter")["ceiling_pct"] == pytest.approx(25.0)


def _worker_run(run_dir, peak: dict | None, device: dict) -> None:
    """A run directory around the op trace: run.json with `device` (and `peak`), its op costs, and a
    steps.csv without rows (the trace's steps are the ones)."""
    import json

    from analysis.read.op_costs import OP_COST_COLUMNS
    from analysis.read.run_files import STEPS_COLUMNS

    trace = run_dir / "plugins" / "profile" / "session" / "roof.xplane.pb"
    trace.parent.mkdir(parents=True)
    write_op_trace(trace)
    (run_dir / "run.json").write_text(
        json.dumps({"status": "complete", "device": device, **({"peak": peak} if peak else {})})
    )
    costs = _costs()
    for column in OP_COST_COLUMNS:
        if column not in costs:
            costs[column] = ""
    costs[OP_COST_COLUMNS].to_csv(run_dir / "op_costs.csv", index=False)
    (run_dir / "steps.csv").write_text(",".join(STEPS_COLUMNS) + "\n")


def test_a_worker_sharing_its_machine_is_held_to_its_share_of_the_cores(tmp_path):
    from analysis import analyze

    peak = {
        "device": "cpu",
        "device_name": "cpu x",
        "threads": {"cores": 2, "intra_op": 0},
        "peak_flops_per_second": {"float32": 4e11},
        "ceilings": {
            "float32": {
                "matrix_flops_per_second": 4e11,
                "vector_flops_per_second": 5e10,
                "memory_bytes_per_second": 1e10,
            }
        },
    }
    worker = {"kind": "cpu", "cores": 2, "local_workers": 2, "intra_op_threads": 1, "inter_op_threads": 1}
    _worker_run(tmp_path / "w", peak, worker)
    analysis = analyze(tmp_path / "w")
    roof = analysis.roofline
    # one of the two cores the peak was measured on: half its compute ceilings, the machine's bandwidth
    assert roof["ceilings"]["float32"] == {
        "matrix_flops_per_second": 2e11,
        "vector_flops_per_second": 2.5e10,
        "memory_bytes_per_second": 1e10,
    }
    assert roof["ceilings_source"] == "run.json peak x 1/2 cores (this worker's share)"
    assert _row(analysis, "net/conv2/Conv2DBackpropFilter")["ceiling_pct"] == pytest.approx(50.0)
    # a worker alone on its machine keeps the whole peak
    _worker_run(tmp_path / "alone", peak, {"kind": "cpu", "cores": 2})
    assert analyze(tmp_path / "alone").roofline["ceilings_source"] == "run.json peak"


def test_unknown_ceilings_leave_the_share_empty_and_say_so(tmp_path):
    analysis = _analysis(tmp_path, peak=None)
    assert analysis.ops["ceiling_pct"].isna().all() and set(analysis.ops["bound"]) == {""}
    assert _row(analysis, "net/conv2/Conv2DBackpropFilter")["flops_per_second"] == pytest.approx(1e11, rel=1e-6)
    assert any("compute ceilings unknown" in note for note in analysis.roofline["notes"])
    assert math.isnan(analysis.roofline["mfu_pct"])
    assert "below_roofline" not in {f["rule"] for f in analysis.findings}


def test_no_costs_are_never_guessed(tmp_path):
    analysis = _analysis(tmp_path, costs=_costs().iloc[:0])
    assert analysis.ops["flops_per_step"].isna().all()
    assert any("no op costs" in note for note in analysis.roofline["notes"])


def test_a_type_the_graph_does_not_have_is_unknown(tmp_path):
    costs = _costs()
    costs.loc[costs["op"] == "net/relu/Relu", "type"] = "Sigmoid"  # the trace ran a Relu under that name
    assert math.isnan(_row(_analysis(tmp_path, costs=costs), "net/relu/Relu")["flops_per_step"])


def test_an_rnn_loops_ops_take_their_body_graphs_costs_once_per_iteration(tmp_path):
    # Keras's fit inlines its step function ("StatefulPartitionedCall/") and TensorFlow lowers the LSTM's
    # `while`: each time step runs the body's matmuls as "<loop>/body/_14/<the body graph's name>"
    loop = "StatefulPartitionedCall/net/lstm/while/body/_14/net/lstm/while/lstm_cell/"
    grad = "StatefulPartitionedCall/gradient_tape/net/lstm/while/net/lstm/while_grad/body/_107/gradient_tape/g/"
    time_steps = 5
    ops = [
        (f"{loop}MatMul", "_MklMatMul", 0.2),
        (f"{loop}MatMul_1", "_MklMatMul", 0.3),
        (f"{grad}MatMul_1_grad/MatMul", "_MklMatMul", 0.4),
    ] * time_steps + [("StatefulPartitionedCall/net/dense/MatMul", "_MklMatMul", 0.5)]
    row = {
        "type": "MatMul",
        "dtype": "float32",
        "kind": "matrix",
        "bytes": 1e3,
        "flops_source": "tensorflow",
        "chain_flops": math.nan,
        "chain_bytes": math.nan,
    }
    costs = pd.DataFrame(
        [
            {
                **row,
                "function": "net_lstm_while_body_7_rewritten",
                "op": "net/lstm/while/lstm_cell/MatMul",
                "flops": 768.0,
            },
            {
                **row,
                "function": "net_lstm_while_body_7_rewritten",
                "op": "net/lstm/while/lstm_cell/MatMul_1",
                "flops": 2048.0,
            },
            {
                **row,
                "function": "net_lstm_while_body_7_grad_9",
                "op": "gradient_tape/g/MatMul_1_grad/MatMul",
                "flops": 2048.0,
            },
            {**row, "function": "one_step_on_data", "op": "net/dense/MatMul", "flops": 64.0},
        ]
    )
    inputs = read_inputs(write_op_trace(tmp_path / "rnn.xplane.pb", ops))
    analysis = analyze_inputs(dataclasses.replace(inputs, op_costs=costs), peak=CEILINGS)
    got = analysis.ops.set_index("op")["flops_per_step"]
    assert got[f"{loop}MatMul"] == pytest.approx(768.0 * time_steps)
    assert got[f"{loop}MatMul_1"] == pytest.approx(2048.0 * time_steps)
    assert got[f"{grad}MatMul_1_grad/MatMul"] == pytest.approx(2048.0 * time_steps)
    assert got["StatefulPartitionedCall/net/dense/MatMul"] == pytest.approx(64.0)
    assert analysis.roofline is not None
    assert analysis.roofline["known_time_pct"] == pytest.approx(100.0)


def test_graph_names_of_inlined_and_lowered_ops():
    assert roofline.graph_name("net/conv2/Conv2D") == "net/conv2/Conv2D"
    assert roofline.graph_name("StatefulPartitionedCall/net/dense/Add") == "net/dense/Add"
    assert roofline.graph_name("a/PartitionedCall_3/b/while/body/_9/b/while/c/MatMul") == "b/while/c/MatMul"
    assert roofline.graph_name("net/while/cond/_2/Less") == "Less"


def test_ceilings_from_a_peak_result_of_each_format():
    new = {
        "device_name": "cpu x",
        "peak_flops_per_second": {"float32": 2e11},
        "ceilings": {
            "float32": {
                "matrix_flops_per_second": 2e11,
                "vector_flops_per_second": 3e10,
                "memory_bytes_per_second": 4e10,
            }
        },
    }
    got = roofline.ceilings_from_peak(new, "run.json peak")
    assert got is not None
    assert got.of("float32") == {
        "matrix_flops_per_second": 2e11,
        "vector_flops_per_second": 3e10,
        "memory_bytes_per_second": 4e10,
    }
    old = {"peak_flops_per_second": {"float32": 2e11, "bfloat16": 1e10}, "memory_bytes_per_second": 4e10}
    got = roofline.ceilings_from_peak(old, "run.json peak")
    assert got is not None
    assert got.of("bfloat16")["matrix_flops_per_second"] == 1e10
    assert math.isnan(got.of("bfloat16")["vector_flops_per_second"])
    assert got.of("bfloat16")["memory_bytes_per_second"] == 4e10
    assert roofline.ceilings_from_peak({"device": "cpu", "error": "no"}, "run.json peak") is None
    assert roofline.ceilings_from_peak(None, "run.json peak") is None


@pytest.mark.parametrize(
    "text, expected",
    [("1307", {"*": 1307e12}), ("bfloat16=1307.4, float32=163.4", {"bfloat16": 1307.4e12, "float32": 163.4e12})],
)
def test_peak_tflops_parses(text, expected):
    assert roofline.parse_peak_tflops(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["fast", "bfloat16=", "-3", "nan", "float32=0"])
def test_peak_tflops_rejects_what_is_not_a_peak(text):
    with pytest.raises(ValueError, match="--peak-tflops"):
        roofline.parse_peak_tflops(text)


def test_a_stated_bandwidth_fills_only_an_unknown_memory_ceiling():
    user = roofline.ceilings_from_tflops({"*": 1e15}).for_dtypes(["bfloat16"])
    bounded = roofline.with_bandwidth(user, 5.3e12, ["bfloat16"], "trace")
    assert bounded is not None
    got = bounded.of("bfloat16")
    assert got["matrix_flops_per_second"] == 1e15 and got["memory_bytes_per_second"] == 5.3e12
    assert math.isnan(got["vector_flops_per_second"])
    measured = roofline.Ceilings(
        {
            "float32": {
                "matrix_flops_per_second": 1e11,
                "vector_flops_per_second": 1e10,
                "memory_bytes_per_second": 2e10,
            }
        },
        "run.json peak",
    )
    kept = roofline.with_bandwidth(measured, 9e12, ["float32"], "trace")
    assert kept is not None
    assert kept.of("float32")["memory_bytes_per_second"] == 2e10 and kept.source == "run.json peak"


def test_a_fused_op_named_after_its_matrix_op_takes_that_ops_costs(tmp_path):
    costs = _costs()
    # the fused op carries the BiasAdd's name; here its graph row is the convolution itself, without a chain
    costs.loc[costs["op"] == "net/conv2/BiasAdd", ["type", "kind", "flops", "bytes", "chain_flops"]] = [
        "Conv2D",
        "matrix",
        3e8,
        3e6,
        math.nan,
    ]
    fused = _row(_analysis(tmp_path, costs=costs), "net/conv2/BiasAdd")
    assert fused["flops_per_step"] == pytest.approx(3e8) and fused["kind"] == "matrix"
    # a non-matrix node without a chain is not the fused op's cost
    costs.loc[costs["op"] == "net/conv2/BiasAdd", ["type", "kind", "flops"]] = ["BiasAdd", "vector", 1e6]
    assert math.isnan(_row(_analysis(tmp_path, costs=costs), "net/conv2/BiasAdd")["flops_per_step"])


def _one_kernel_name_per_op(path) -> None:
    """Every launch of an op runs the same kernel, as a compiled program's do (the fixture numbers them)."""
    from xplane_message import load_xspace

    space = load_xspace(path)
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if names.get(event.metadata_id, "").startswith("kernel_"):
                    program = next(s.int64_value for s in event.stats if stat_names[s.metadata_id] == "program_id")
                    key = max(plane.event_metadata) + 1
                    wanted = f"gemm_program_{program}"
                    found = next((k for k, n in names.items() if n == wanted), None)
                    if found is None:
                        plane.event_metadata[key].id, plane.event_metadata[key].name = key, wanted
                        names[key], found = wanted, key
                    event.metadata_id = found
    path.write_bytes(space.SerializeToString())


def test_xla_ops_take_their_own_programs_hlo_costs_and_the_stated_bandwidth(tmp_path):
    from analysis import analyze
    from hlo_fixtures import matmul_program, write_trace

    # two programs whose dots share a name; program 7 runs its dot three times, program 8 twice
    shapes = {7: (512, 256, 1024), 8: (128, 128, 64)}
    path = write_trace(
        tmp_path / "x.xplane.pb",
        {key: (f"jit_matmul({key})", matmul_program(*shape, program_id=key).bytes()) for key, shape in shapes.items()},
        [("jit_matmul", "dot.1", 7)] * 3 + [("jit_matmul", "dot.1", 8)] * 2,
        device_stats={"memory_bandwidth": 2_000_000_000_000},
    )
    _one_kernel_name_per_op(path)
    analysis = analyze(path, peak=roofline.ceilings_from_tflops(roofline.parse_peak_tflops("1000")))
    ops = analysis.ops.set_index("program_id")
    steps = float(analysis.steps["steps"].sum()) if "steps" in analysis.steps else float(len(analysis.steps))
    for key, executions in ((7, 3), (8, 2)):
        m, n, k = shapes[key]
        row = ops.loc[float(key)]
        assert row["flops_per_step"] == pytest.approx(2 * m * n * k * executions / steps)
        assert row["bytes_per_step"] == pytest.approx(2 * (m * k + k * n + m * n) * executions / steps)
        assert row["program"] == f"jit_matmul({key})" and row["dtype"] == "bfloat16" and row["kind"] == "matrix"
        # each kernel lasts 0.5 ms: the rate is FLOPs per 0.5 ms; the roof is the smaller of 1 PFLOP/s and 2 TB/s x I
        rate = 2 * m * n * k / 0.5e-3
        roof = min(1e15, 2e12 * row["intensity"])
        assert row["flops_per_second"] == pytest.approx(rate)
        assert row["ceiling_pct"] == pytest.approx(100 * rate / roof)
        assert row["bound"] == ("compute" if row["intensity"] >= 1e15 / 2e12 else "memory")
    assert analysis.roofline["ceilings"]["bfloat16"]["memory_bytes_per_second"] == 2e12
    assert analysis.roofline["ceilings_source"] == "--peak-tflops + trace (stated bandwidth)"


def test_a_device_plane_that_states_its_peak_fills_the_compute_ceiling(tmp_path):
    from analysis import analyze
    from hlo_fixtures import matmul_program, write_trace

    # as XProf's planes state them: TFLOP/s (a double), HBM GB/s where no `memory_bandwidth` is given
    path = write_trace(
        tmp_path / "x.xplane.pb",
        {7: ("jit_matmul(7)", matmul_program(512, 256, 1024).bytes())},
        [("jit_matmul", "dot.1", 7)] * 3,
        device_stats={"peak_teraflops_per_second": 1000.0, "peak_hbm_bw_gigabytes_per_second": 2000.0},
    )
    _one_kernel_name_per_op(path)
    roof = analyze(path).roofline
    assert roof["ceilings"]["bfloat16"]["matrix_flops_per_second"] == 1e15
    assert roof["ceilings"]["bfloat16"]["memory_bytes_per_second"] == 2e12
    assert roof["ceilings_source"] == "trace (stated peak) + trace (stated bandwidth)"
    assert roof["mfu_pct"] == pytest.approx(100 * roof["achieved_flops_per_second"] / 1e15)
    assert not any("compute ceilings unknown" in note for note in roof["notes"])
    # a peak the user gives wins over the stated one
    given = analyze(path, peak=roofline.ceilings_from_tflops(roofline.parse_peak_tflops("1200"))).roofline
    assert given["ceilings"]["bfloat16"]["matrix_flops_per_second"] == 1.2e15
    assert given["ceilings_source"] == "--peak-tflops + trace (stated bandwidth)"


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--peak-tflops", "fast"], "error: --peak-tflops 'fast': 'fast' is not a number"),
        (["--peak-tflops", "1e30"], "error: --peak-tflops '1e30': 1e30 TFLOP/s is above the 1,000,000 TFLOP/s"),
        (
            ["--peak-tflops", "float32=1,float32=2"],
            "error: --peak-tflops 'float32=1,float32=2': float32 is given twice",
        ),
        (["--peak-tflops", "1,2"], "one number for every dtype is given twice"),
        (["--peak-tflops", "bf16=1307"], "error: --peak-tflops 'bf16=1307': 'bf16' is not a dtype"),
        (["--peak-file", "{missing}"], "error: --peak-file {missing}: cannot read it"),
        (["--peak-file", "{notpeak}"], "not a devprof peak result"),
        (["--peak-file", "{absurd}"], "error: --peak-file {absurd}: no usable peak"),
        (["--peak-tflops", "1", "--peak-file", "{notpeak}"], "not allowed with argument"),
    ],
)
def test_bad_ceilings_are_one_error_line_and_exit_2(tmp_path, capsys, flags, says):
    from profiler import cli

    trace = write_op_trace(tmp_path / "roof.xplane.pb")
    (tmp_path / "notpeak.json").write_text('{"device": "cpu"}')
    (tmp_path / "absurd.json").write_text('{"peak_flops_per_second": {"float32": 1e300, "bfloat16": "fast"}}')
    names = {
        "missing": str(tmp_path / "missing.json"),
        "notpeak": str(tmp_path / "notpeak.json"),
        "absurd": str(tmp_path / "absurd.json"),
    }
    flags = [f.format(**names) for f in flags]
    code = cli.main(["analyze", str(trace), *flags])
    err = capsys.readouterr().err
    assert code == 2 and says.format(**names) in err, err
    assert "Traceback" not in err


def test_a_peak_file_gives_the_ceilings_on_the_command_line(tmp_path, capsys):
    import json

    from profiler import cli

    trace = write_op_trace(tmp_path / "roof.xplane.pb")
    peak = {
        "device_name": "cpu x",
        "peak_flops_per_second": {"float32": 4e11},
        "ceilings": {
            "float32": {
                "matrix_flops_per_second": 4e11,
                "vector_flops_per_second": 5e10,
                "memory_bytes_per_second": 1e10,
            }
        },
    }
    (tmp_path / "peak.json").write_text(json.dumps(peak))
    # the trace alone has no costs: its ops are unknown, the ceilings are known
    assert cli.main(["analyze", str(trace), "--peak-file", str(tmp_path / "peak.json"), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["roofline"]["ceilings"]["float32"]["matrix_flops_per_second"] == 4e11
    assert document["roofline"]["ceilings_source"] == "peak file"
    assert any("no op costs" in note for note in document["roofline"]["notes"])


def test_ceilings_for_another_dtype_than_the_ops_say_so(tmp_path):
    """`--peak-tflops float16=5` on a float32 run: the ceilings were dropped without a word."""
    analysis = _analysis(tmp_path, peak=roofline.ceilings_from_tflops({"float16": 5.0}))
    assert analysis.ops["ceiling_pct"].isna().all()
    assert any(
        "no ceiling for float32, the dtype of ops with known costs (ceilings are given for float16 only)" in n
        for n in analysis.roofline["notes"]
    ), analysis.roofline["notes"]
    assert not any("no ceiling for" in n for n in _analysis(tmp_path / "f32", peak=CEILINGS).roofline["notes"])


def test_a_ceiling_the_peak_search_could_not_measure_is_unknown_not_a_number():
    import math

    from analysis.breakdown.roofline import ceilings_from_peak

    peak = {
        "device": "cpu",
        "ceilings": {
            "bfloat16": {
                "matrix_flops_per_second": 4e12,
                "vector_flops_per_second": 1.3e9,
                "memory_bytes_per_second": 5e10,
            },
            "float32": {
                "matrix_flops_per_second": 4e11,
                "vector_flops_per_second": 2e11,
                "memory_bytes_per_second": 5e10,
            },
        },
        "vector": {
            "bfloat16": {"k": 1, "stopped": "time", "sizes": [{"size": 1, "per_second": 1.3e9}]},
            "float32": {"k": 16, "stopped": "time", "sizes": [{"size": 1}, {"size": 4}, {"size": 16}]},
        },
    }
    ceilings = ceilings_from_peak(peak, "cache")
    assert ceilings is not None
    assert math.isnan(ceilings.of("bfloat16")["vector_flops_per_second"])  # K 1-1: it gave up
    assert ceilings.of("float32")["vector_flops_per_second"] == 2e11  # it grew, then stopped: measured
    assert ceilings.of("bfloat16")["matrix_flops_per_second"] == 4e12
