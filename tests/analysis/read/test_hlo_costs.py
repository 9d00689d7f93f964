"""FLOPs and bytes of XLA programs from the `Hlo Proto` a trace stores (analysis.read.hlo_costs).

Each test writes an XSpace whose `/host:metadata` plane holds HloProtos built here with known
shapes, and a GPU plane whose kernels name their instructions, as XLA's GPU profiler writes them.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import pytest

import analysis.read.xla_proto
from analysis.read import hlo_costs as hc
from analysis.read.run_files import RunFileWarning
from analysis.read.trace import DeviceSpecs, device_specs, read_trace
from analysis.read.view import TraceView
from analysis.read.xla_proto import hlo_pb2, xla_data_pb2
from hlo_fixtures import Program, matmul_program, write_trace
from repo_paths import REPO

GEMM = REPO.parent / "shared/traces/jax-mi300-gemm"


def only(table, op: str):
    rows = table[table["op"] == op]
    assert len(rows) == 1, table.to_string()
    return rows.iloc[0]


def test_dot_flops_are_2mnk_and_bytes_its_operands_and_output(tmp_path):
    m, n, k = 384, 256, 1000
    path = write_trace(
        tmp_path / "t.xplane.pb", {7: ("jit_matmul(7)", matmul_program(m, n, k).bytes())}, [("jit_matmul", "dot.1", 7)]
    )
    table = hc.hlo_costs(path)
    assert list(table.columns) == list(hc.COLUMNS)
    assert list(table["op"]) == ["dot.1"]  # parameters launch no kernel: no row
    row = only(table, "dot.1")
    assert row["flops"] == 2 * m * n * k
    assert row["bytes"] == (m * k + k * n + m * n) * 2
    assert (row["function"], row["type"], row["dtype"], row["kind"], row["flops_source"]) == (
        "jit_matmul",
        "dot",
        "bfloat16",
        "matrix",
        "hlo",
    )
    assert (row["input_shapes"], row["output_shapes"], row["program_id"]) == (f"{m}x{k};{k}x{n}", f"{m}x{n}", 7.0)
    assert math.isnan(row["chain_flops"]) and math.isnan(row["chain_bytes"])
    assert table.attrs["note"] == ""


def test_batched_dot_counts_batch_and_every_contracting_dimension(tmp_path):
    program = Program("jit_bmm", 3)
    entry = program.computation("main", entry=True)
    lhs = program.add(entry, "a", "parameter", "F32", [4, 6, 5, 7])  # batch 4, M 6, K 5x7
    rhs = program.add(entry, "b", "parameter", "F32", [4, 5, 7, 9])  # batch 4, K 5x7, N 9
    dot = program.add(entry, "dot", "dot", "F32", [4, 6, 9], (lhs, rhs))
    numbers = dot.dot_dimension_numbers
    numbers.lhs_batch_dimensions.append(0), numbers.rhs_batch_dimensions.append(0)
    numbers.lhs_contracting_dimensions.extend([2, 3]), numbers.rhs_contracting_dimensions.extend([1, 2])
    table = hc.hlo_costs(write_trace(tmp_path / "t.xplane.pb", {3: ("jit_bmm(3)", program.bytes())}))
    assert only(table, "dot")["flops"] == 2 * 4 * 6 * 9 * (5 * 7)
    assert only(table, "dot")["dtype"] == "float32"


def _conv_dimension_numbers(instruction):
    """NHWC input, HWIO kernel, NHWC output."""
    numbers = instruction.convolution_dimension_numbers
    numbers.input_batch_dimension, numbers.input_feature_dimension = 0, 3
    numbers.input_spatial_dimensions.extend([1, 2])
    numbers.kernel_spatial_dimensions.extend([0, 1])
    numbers.kernel_input_feature_dimension, numbers.kernel_output_feature_dimension = 2, 3
    numbers.output_batch_dimension, numbers.output_feature_dimension = 0, 3
    numbers.output_spatial_dimensions.extend([1, 2])


def test_grouped_convolution_flops_follow_the_formula(tmp_path):
    batch, height, width, features, groups, filters, kh, kw = 8, 30, 30, 12, 3, 24, 3, 5
    out_h, out_w = height - kh + 1, width - kw + 1
    program = Program("jit_conv", 11)
    entry = program.computation("main", entry=True)
    image = program.add(entry, "x", "parameter", "F16", [batch, height, width, features])
    kernel = program.add(entry, "w", "parameter", "F16", [kh, kw, features // groups, filters])
    conv = program.add(
        entry,
        "convolution.2",
        "convolution",
        "F16",
        [batch, out_h, out_w, filters],
        (image, kernel),
        feature_group_count=groups,
    )
    _conv_dimension_numbers(conv)
    table = hc.hlo_costs(write_trace(tmp_path / "t.xplane.pb", {11: ("jit_conv(11)", program.bytes())}))
    row = only(table, "convolution.2")
    # 2 x output elements x kernel spatial x input features / feature_group_count
    assert row["flops"] == 2 * (batch * out_h * out_w * filters) * (kh * kw) * (features / groups)
    assert row["bytes"] == 2 * (
        batch * height * width * features + kh * kw * (features // groups) * filters + batch * out_h * out_w * filters
    )
    assert (row["kind"], row["dtype"]) == ("matrix", "float16")


def test_fusion_sums_what_it_fuses_and_its_bytes_are_its_own_operands_and_output(tmp_path):
    m, n, k = 64, 48, 32
    program = Program("jit_dense", 5)
    fused = program.computation("fused_dense")
    p0 = program.add(fused, "p0", "parameter", "BF16", [m, k])
    p1 = program.add(fused, "p1", "parameter", "BF16", [k, n])
    p2 = program.add(fused, "p2", "parameter", "BF16", [n])
    dot = program.add(fused, "dot", "dot", "BF16", [m, n], (p0, p1))
    dot.dot_dimension_numbers.lhs_contracting_dimensions.append(1)
    bias = program.add(fused, "bias", "broadcast", "BF16", [m, n], (p2,))
    added = program.add(fused, "add", "add", "BF16", [m, n], (dot, bias))
    program.add(fused, "relu", "maximum", "BF16", [m, n], (added, bias))
    entry = program.computation("main", entry=True)
    a = program.add(entry, "a", "parameter", "BF16", [m, k])
    b = program.add(entry, "b", "parameter", "BF16", [k, n])
    c = program.add(entry, "c", "parameter", "BF16", [n])
    fusion = program.add(entry, "dense_fusion", "fusion", "BF16", [m, n], (a, b, c))
    fusion.called_computation_ids.append(fused.id)
    table = hc.hlo_costs(write_trace(tmp_path / "t.xplane.pb", {5: ("jit_dense(5)", program.bytes())}))
    assert list(table["op"]) == ["dense_fusion"]  # the fused instructions have no rows of their own
    row = only(table, "dense_fusion")
    assert row["flops"] == 2 * m * n * k + m * n + m * n  # the dot, the add, the maximum; a broadcast is free
    assert row["bytes"] == 2 * (m * k + k * n + n + m * n)
    assert (row["kind"], row["dtype"], row["type"]) == ("matrix", "bfloat16", "fusion")


def test_elementwise_reduce_and_data_movement_rules(tmp_path):
    program = Program("jit_misc", 2)
    entry = program.computation("main", entry=True)
    x = program.add(entry, "x", "parameter", "F32", [100, 30])
    zero = program.add(entry, "zero", "constant", "F32", [])
    program.add(entry, "exp", "exponential", "F32", [100, 30], (x,))
    program.add(entry, "sum", "reduce", "F32", [100], (x, zero))
    program.add(entry, "t", "transpose", "F32", [30, 100], (x,))
    table = hc.hlo_costs(write_trace(tmp_path / "t.xplane.pb", {2: ("jit_misc(2)", program.bytes())}))
    assert list(table["op"]) == ["exp", "sum", "t"]
    assert tuple(only(table, "exp")[["flops", "kind", "flops_source"]]) == (3000, "vector", "hlo")
    assert tuple(only(table, "sum")[["flops", "bytes", "input_shapes"]]) == (3000, 4 * (3000 + 1 + 100), "100x30;")
    assert tuple(only(table, "t")[["flops", "kind", "flops_source", "bytes"]]) == (0, "", "none", 4 * 6000)


def test_gemm_library_call_uses_the_backend_config_and_leaves_out_its_scratch(tmp_path):
    m, n, k = 512, 128, 768
    program = Program("jit_dot", 64)
    entry = program.computation("main", entry=True)
    lhs = program.add(entry, "a", "parameter", "BF16", [k, m])  # transposed lhs: contracting dimension 0
    rhs = program.add(entry, "b", "parameter", "BF16", [k, n])
    config = {
        "gemm_backend_config": {
            "dot_dimension_numbers": {"lhs_contracting_dimensions": ["0"], "rhs_contracting_dimensions": ["0"]}
        }
    }
    program.add(
        entry,
        "custom-call.1",
        "custom-call",
        "",
        [],
        (lhs, rhs),
        tuple_of=[("BF16", [m, n]), ("S8", [1 << 26])],
        custom_call_target="__cublas$gemm",
        backend_config=json.dumps(config).encode(),
    )
    # Without dimension numbers: the lhs's last dimension is contracted.
    lhs2 = program.add(entry, "c", "parameter", "F32", [m, k])
    program.add(
        entry,
        "custom-call.2",
        "custom-call",
        "",
        [],
        (lhs2, rhs),
        tuple_of=[("F32", [m, n]), ("U8", [4096])],
        custom_call_target="__cublas$lt$matmul",
    )
    program.add(entry, "custom-call.3", "custom-call", "F32", [m], (lhs2,), custom_call_target="my_own_kernel")
    table = hc.hlo_costs(write_trace(tmp_path / "t.xplane.pb", {64: ("jit_dot(64)", program.bytes())}))
    first = only(table, "custom-call.1")
    assert first["flops"] == 2 * m * n * k
    assert first["bytes"] == 2 * (k * m + k * n + m * n)  # not the 64 MiB workspace
    assert (first["output_shapes"], first["kind"], first["dtype"]) == (f"{m}x{n}", "matrix", "bfloat16")
    assert only(table, "custom-call.2")["flops"] == 2 * m * n * k
    unknown = only(table, "custom-call.3")
    assert math.isnan(unknown["flops"]) and (unknown["flops_source"], unknown["kind"]) == ("", "")
    assert unknown["bytes"] == 4 * (m * k + m)


def test_convolution_library_call_backward_filter(tmp_path):
    batch, size, features, filters, kh, kw = 4, 16, 8, 32, 3, 3
    out = size - kh + 1
    program = Program("jit_grad", 9)
    entry = program.computation("main", entry=True)
    image = program.add(entry, "x", "parameter", "F32", [batch, size, size, features])
    grad = program.add(entry, "dy", "parameter", "F32", [batch, out, out, filters])
    call = program.add(
        entry,
        "cudnn-conv-bw-filter",
        "custom-call",
        "",
        [],
        (image, grad),
        tuple_of=[("F32", [kh, kw, features, filters]), ("U8", [0])],
        custom_call_target="__cudnn$convBackwardFilter",
    )
    _conv_dimension_numbers(call)
    table = hc.hlo_costs(write_trace(tmp_path / "t.xplane.pb", {9: ("jit_grad(9)", program.bytes())}))
    row = only(table, "cudnn-conv-bw-filter")
    assert row["flops"] == 2 * (batch * out * out * filters) * (kh * kw) * features
    assert row["bytes"] == 4 * (
        batch * size * size * features + batch * out * out * filters + kh * kw * features * filters
    )


def test_while_body_instructions_are_kernel_level_and_named_ops_get_rows(tmp_path):
    program = Program("jit_loop", 4)
    body = program.computation("body")
    state = program.add(body, "state", "parameter", "F32", [10])
    program.add(body, "step_add", "add", "F32", [10], (state, state))
    condition = program.computation("cond")
    program.add(condition, "cstate", "parameter", "F32", [10])
    helper = program.computation("helper")  # not run by the entry: only a kernel naming it gives it a row
    h = program.add(helper, "hp", "parameter", "F32", [5])
    program.add(helper, "lonely_negate", "negate", "F32", [5], (h,))
    entry = program.computation("main", entry=True)
    start = program.add(entry, "init", "parameter", "F32", [10])
    loop = program.add(entry, "while", "while", "F32", [10], (start,))
    loop.called_computation_ids.extend([condition.id, body.id])
    path = write_trace(
        tmp_path / "t.xplane.pb",
        {4: ("jit_loop(4)", program.bytes())},
        [("jit_loop", "step_add", 4), ("jit_loop", "lonely_negate", 4)],
    )
    assert list(hc.hlo_costs(path)["op"]) == ["step_add"]
    with_kernels = hc.hlo_costs(read_trace(path))
    assert list(with_kernels["op"]) == ["step_add", "lonely_negate"]
    assert only(with_kernels, "lonely_negate")["flops"] == 5


def test_programs_without_hlo_give_no_rows(tmp_path):
    path = write_trace(tmp_path / "t.xplane.pb", {3: ("jit_f(3)", None)}, [("jit_f", "fusion", 3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = hc.hlo_costs(read_trace(path))
    assert table.empty and list(table.columns) == list(hc.COLUMNS) and table.attrs["note"] == ""


def test_a_corrupt_hlo_proto_is_one_warning_and_the_other_programs_count(tmp_path):
    good = matmul_program(8, 8, 8, program_id=7).bytes()
    path = write_trace(
        tmp_path / "t.xplane.pb",
        {
            7: ("jit_matmul(7)", good),
            8: ("jit_bad(8)", b"\xff\xff\xff garbage"),
            9: ("jit_cut(9)", good[: len(good) // 2]),
        },
    )
    with pytest.warns(RunFileWarning) as caught:
        table = hc.hlo_costs(path)
    assert len(caught) == 1
    assert "2 of 3" in str(caught[0].message) and "jit_bad(8)" in str(caught[0].message)
    assert list(table["op"]) == ["dot.1"] and only(table, "dot.1")["flops"] == 2 * 8**3
    assert "2 of 3" in table.attrs["note"]


def test_the_costs_need_no_tensorflow(tmp_path, monkeypatch):
    path = write_trace(tmp_path / "t.xplane.pb", {7: ("jit_matmul(7)", matmul_program(8, 8, 8).bytes())})
    for name in [name for name in sys.modules if name.split(".")[0] == "tensorflow"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` fails, as where it is not installed
    hc._protos.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = hc.hlo_costs(path)
    finally:
        hc._protos.cache_clear()
    assert list(table["op"]) == ["dot.1"] and only(table, "dot.1")["flops"] == 2 * 8**3
    assert table.attrs["note"] == ""


def test_without_a_protobuf_runtime_it_accepts_the_costs_are_unknown_with_one_note(tmp_path, monkeypatch):
    path = write_trace(tmp_path / "t.xplane.pb", {7: ("jit_matmul(7)", matmul_program(8, 8, 8).bytes())})
    monkeypatch.delattr(analysis.read.xla_proto, "hlo_pb2")
    monkeypatch.setitem(sys.modules, "analysis.read.xla_proto.hlo_pb2", None)
    hc._protos.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = hc.hlo_costs(path)
    finally:
        hc._protos.cache_clear()
    assert table.empty and list(table.columns) == list(hc.COLUMNS)
    assert "HloProto classes could not be loaded" in table.attrs["note"]


@pytest.mark.slow
@pytest.mark.skipif(not GEMM.is_dir(), reason="the real traces folder beside the repository is not here")
def test_the_real_gemm_traces_roofline_in_a_process_that_cannot_import_tensorflow():
    """A fresh process where `import tensorflow` fails gives the GEMM trace's FLOPs that TensorFlow's
    own HloProto classes gave (149.26 GFLOP per step: its hipBLASLt GEMMs)."""
    script = (
        "import json, sys\n"
        "sys.modules['tensorflow'] = None\n"
        "from analysis.pipeline import analyze\n"
        f"roofline = analyze({str(GEMM)!r}).roofline\n"
        "print(json.dumps([roofline['flops_per_step'], roofline['bytes_per_step'], roofline['dtype'],\n"
        "                  [name for name, module in sys.modules.items() if name.split('.')[0] == 'tensorflow' and module]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    flops, bytes_, dtype, imported = json.loads(done.stdout.splitlines()[-1])
    assert flops == pytest.approx(149_255_705_941.33334, rel=1e-12)
    assert bytes_ == pytest.approx(122_049_880.66666666, rel=1e-12)
    assert (dtype, imported) == ("bfloat16", [])


@pytest.mark.slow
def test_the_schema_is_wire_compatible_with_xlas_own_as_tensorflow_ships_it():
    """Every field devprof declares has XLA's number and type (TensorFlow's compiled copy of XLA's
    schema), and both load in one process: devprof's package is devprof.xla, XLA's is xla."""
    pytest.importorskip("tensorflow")
    from tensorflow.compiler.xla.service import hlo_pb2 as xla_hlo_pb2  # imports TensorFlow

    def same(ours, theirs):
        for field in ours.fields:
            upstream = theirs.fields_by_name[field.name]
            assert (field.number, field.type, field.is_repeated) == (
                upstream.number,
                upstream.type,
                upstream.is_repeated,
            ), f"{ours.name}.{field.name}"
            for kind in ("message_type", "enum_type"):
                if getattr(field, kind) is not None:
                    assert getattr(field, kind).name == getattr(upstream, kind).name, f"{ours.name}.{field.name}"

    pool = xla_hlo_pb2.DESCRIPTOR.pool
    for module in (hlo_pb2, xla_data_pb2):
        for name, message in module.DESCRIPTOR.message_types_by_name.items():
            same(message, pool.FindMessageTypeByName(f"xla.{name}"))
    ours = {v.name: v.number for v in xla_data_pb2.PrimitiveType.DESCRIPTOR.values}
    theirs = {v.name: v.number for v in pool.FindEnumTypeByName("xla.PrimitiveType").values}
    assert {name: theirs.get(name) for name in ours} == ours
    program = matmul_program(64, 32, 16).proto
    program.hlo_module.computations[0].instructions[2].backend_config = b'{"k": 1}'
    assert (
        xla_hlo_pb2.HloProto.FromString(program.SerializeToString()).SerializeToString() == program.SerializeToString()
    )


def test_device_planes_state_their_specs(tmp_path):
    path = write_trace(
        tmp_path / "t.xplane.pb",
        {},
        [("jit_f", "f", 1)],
        device_stats={
            "device_vendor": "AMD",
            "clock_rate": 2_100_000,
            "core_count": 304,
            "memory_bandwidth": 2_662_400_000_000,
            "memory_size": 206_141_652_992,
            "compute_cap_major": 9,
            "compute_cap_minor": 4,
            "peak_teraflops_per_second": 1307.4,
        },
    )
    expected = DeviceSpecs("/device:GPU:0", "AMD", 2.6624e12, 2.1e9, 304.0, 206_141_652_992.0, "9.4", 1.3074e15)
    assert device_specs(path) == {"/device:GPU:0": expected}
    assert TraceView(read_trace(path)).device_specs == {"/device:GPU:0": expected}
    bare = write_trace(tmp_path / "bare.xplane.pb", {}, [("jit_f", "f", 1)])
    assert device_specs(bare) == {}


def test_columns_are_the_cost_table_contract():
    op_costs = pytest.importorskip("analysis.read.op_costs")
    assert list(hc.COST_COLUMNS) == list(op_costs.OP_COST_COLUMNS)
