"""FLOPs and bytes of every op of the program's traced functions, written to `<run>/op_costs.csv`.

TensorFlow's trace names each op it ran ("node_name:OpType") but carries no shapes, and the
GraphDefs TensorFlow hands out after optimization lack them too; the live Python graphs of the
traced `tf.function`s (`FuncGraph`) have every static shape. No public API lists the functions a
program traced, so they are found among the objects the garbage collector tracks (0.1-0.4 s with
Keras loaded), once, after the profile window's trace is written: never between traced steps.

FLOPs: TensorFlow's own registered statistic where it has one (what `tf.compat.v1.profiler`
counts), else a stated formula, else unknown (docs/rules.md lists them). Bytes: every input
and output once. The columns and their meaning are `analysis/read/op_costs.py`'s.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from analysis.read import op_costs as columns
from analysis.read.op_costs import (
    KIND_MATRIX,
    KIND_NONE,
    KIND_VECTOR,
    OP_COST_COLUMNS,
    OP_COSTS_CSV,
    SOURCE_FORMULA,
    SOURCE_NONE,
    SOURCE_TENSORFLOW,
    SOURCE_UNKNOWN,
)

NAN = math.nan

# Ops that move, reshape, read or name data without arithmetic: 0 FLOPs, kind "". A function
# call or control-flow op counts 0 too: its body is a function of its own, recorded with its nodes.
NO_ARITHMETIC = frozenset(
    """
    Identity IdentityN Snapshot StopGradient PreventGradient EnsureShape CheckNumerics CheckNumericsV2
    Reshape Squeeze ExpandDims Transpose Const HostConst Placeholder PlaceholderWithDefault _Arg _Retval
    NoOp Shape ShapeN Size Rank ReadVariableOp AssignVariableOp VarHandleOp VarIsInitializedOp
    DestroyResourceOp Fill ZerosLike OnesLike Tile Pad PadV2 MirrorPad Concat ConcatV2 Pack Unpack Split SplitV
    Slice StridedSlice StridedSliceGrad TensorScatterUpdate Gather GatherV2 GatherNd ResourceGather
    BroadcastTo BroadcastArgs BroadcastGradientArgs Reverse ReverseV2 OneHot DeepCopy
    Print PrintV2 StringFormat Assert
    IteratorGetNext IteratorGetNextSync IteratorGetNextAsOptional OptionalGetValue OptionalHasValue
    OptionalFromValue OptionalNone MakeIterator AnonymousIteratorV2 AnonymousIteratorV3 DeleteIterator
    If StatelessIf While StatelessWhile Case StatelessCase PartitionedCall StatefulPartitionedCall
    Switch Merge Enter Exit NextIteration LoopCond ControlTrigger
    TensorListFromTensor TensorListGetItem TensorListSetItem TensorListStack TensorListReserve
    TensorListLength TensorListElementShape TensorListPushBack TensorListPopBack
""".split()
)

# Element-wise ops without a TensorFlow statistic: 1 FLOP per output element (also those that
# count more in hardware, such as exp or tanh: XLA's cost analysis counts them as 1 too).
ELEMENTWISE = frozenset(
    """
    Abs Acos Acosh Asin Asinh Atan Atanh Atan2 Ceil Cos Cosh Digamma Erf Erfc Exp Expm1 Floor Inv Lgamma Log1p
    Round Rint Sign Sin Sinh Sqrt Tan Tanh Sigmoid Relu Relu6 Elu Selu LeakyRelu Softplus Softsign
    ReluGrad Relu6Grad EluGrad SeluGrad LeakyReluGrad SigmoidGrad TanhGrad SqrtGrad SoftplusGrad SoftsignGrad
    InvGrad ReciprocalGrad
    Cast Div DivNoNan FloorDiv FloorMod Mod TruncateDiv TruncateMod MulNoNan Xdivy Xlogy Xlog1py
    Select SelectV2 ClipByValue ApproximateEqual IsFinite IsNan IsInf LogicalAnd LogicalOr LogicalNot
    BitwiseAnd BitwiseOr BitwiseXor Invert LeftShift RightShift BiasAddV1 AddN
    AssignAddVariableOp AssignSubVariableOp
""".split()
)

# Reductions without a TensorFlow statistic: 1 FLOP per input element.
REDUCTIONS = frozenset("Max Min Prod All Any EuclideanNorm".split())

# FLOPs per element of the last (or only) input or output named: the documented math of each.
PER_ELEMENT = {
    "LogSoftmax": 5,  # as TensorFlow counts Softmax: shift 2, exp 1, normalize 2
    "SoftmaxCrossEntropyWithLogits": 6,  # the softmax's 5 and 1 for the gradient it returns, per logit
    "SparseSoftmaxCrossEntropyWithLogits": 6,
}
BATCH_NORM = frozenset("FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3".split())
BATCH_NORM_GRAD = frozenset("FusedBatchNormGrad FusedBatchNormGradV2 FusedBatchNormGradV3".split())
BATCH_NORM_TRAINING, BATCH_NORM_INFERENCE, BATCH_NORM_BACKWARD = 5, 2, 7  # per element of x

# Fused optimizer updates: FLOPs per variable element, from each update's documented formula.
OPTIMIZER_UPDATES = {
    "ApplyGradientDescent": 2,  # var -= alpha * delta
    "ApplyMomentum": 4,
    "ApplyKerasMomentum": 4,  # accum = accum * momentum + grad; var -= lr * accum
    "ApplyAdagrad": 6,
    "ApplyAdagradV2": 6,  # accum += grad^2; var -= lr * grad / sqrt(accum)
    "ApplyAdam": 12,  # m: 3, v: 4, var -= lr_t * m / (sqrt(v) + epsilon): 5
    "ApplyRMSProp": 11,  # ms: 4, mom: 6, var -= mom: 1
}

MATRIX_TYPES = frozenset("MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 SparseMatMul Einsum".split())
# Matrix ops that Grappler (and oneDNN) fuse with the BiasAdd (or inference batch norm) and
# activation after them into one `_FusedConv2D` / `_FusedMatMul` named after the chain's last node.
FUSABLE_MATRIX = frozenset("Conv2D Conv3D MatMul DepthwiseConv2dNative".split())
FUSABLE_ACTIVATIONS = frozenset("Relu Relu6 Elu LeakyRelu Tanh Sigmoid".split())

_flops_registry_loaded = False


def is_matrix(op_type: str) -> bool:
    return op_type in MATRIX_TYPES or op_type.startswith(("Conv", "DepthwiseConv"))


# ---------------------------------------------------------------- shapes and bytes


def shape_text(shape) -> str:
    """`128x32x32x3`; "" for a scalar, "?" for an unknown dimension or rank."""
    if shape.rank is None:
        return columns.UNKNOWN_DIMENSION
    return columns.DIMENSION_SEPARATOR.join(columns.UNKNOWN_DIMENSION if d is None else str(d) for d in shape.as_list())


def elements(tensor) -> float:
    """Elements of a tensor's static shape; NaN when not fully known."""
    shape = tensor.shape
    return float(shape.num_elements()) if shape.is_fully_defined() else NAN


def tensor_bytes(tensor) -> float:
    """Bytes of a tensor; resource handles, strings and variants count 0 (what they point to is
    counted where it is read or written: `ReadVariableOp`'s output, an update's variable)."""
    dtype = tensor.dtype
    if dtype.name in ("resource", "variant", "string"):
        return 0.0
    return elements(tensor) * dtype.size


def _variable_updates(op) -> float:
    """Bytes of the variables an op updates through resource handles: read and written, each the
    size of the update (the gradient's, the value's); AssignVariableOp only writes."""
    handles = [t for t in op.inputs if t.dtype.name == "resource"]
    if not handles or not (
        op.type.startswith(("ResourceApply", "Apply"))
        or op.type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
    ):
        return 0.0
    values = [tensor_bytes(t) for t in op.inputs if t.dtype.name != "resource"]
    size = max(values, default=NAN)
    return len(handles) * size * (1 if op.type == "AssignVariableOp" else 2)


def op_bytes(op) -> float:
    """Bytes read (all inputs) + written (all outputs) by one execution of `op`."""
    return sum(tensor_bytes(t) for t in op.inputs) + sum(tensor_bytes(t) for t in op.outputs) + _variable_updates(op)


def op_dtype(op) -> str:
    """The dtype the op's math runs in: its `T` attr, else its first floating input's (or output's)."""
    try:
        return op.get_attr("T").name
    except (ValueError, AttributeError, TypeError):
        pass
    for tensor in (*op.inputs, *op.outputs):
        if tensor.dtype.is_floating:
            return tensor.dtype.name
    return ""


# ---------------------------------------------------------------- FLOPs


def _tensorflow_flops_loaded() -> None:
    """TensorFlow registers most of its FLOPs statistics only when its profiler's registry is imported."""
    global _flops_registry_loaded
    if not _flops_registry_loaded:
        import tensorflow.python.profiler.internal.flops_registry  # noqa: F401 - registers the statistics

        _flops_registry_loaded = True


def _tensorflow_flops(op) -> float | None:
    """TensorFlow's registered statistic, None where it has none (or it fails: an NCHW pool)."""
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.util import deprecation

    _tensorflow_flops_loaded()
    try:
        with deprecation.silence():  # the statistics use a TF1 shape helper that logs a deprecation
            value = tf_ops.get_stats_for_node_def(op.graph, op.node_def, "flops").value
    except Exception:  # noqa: BLE001 - a statistic that cannot handle this node: the formula, if any
        return None
    return None if value is None else float(value)


def _kernel_volume(op, filter_tensor=None) -> float:
    """The spatial size of a pooling window (`ksize`) or of a convolution filter (all but its
    last two dimensions, `[..., in, out]`)."""
    if filter_tensor is None:
        return float(math.prod(op.get_attr("ksize")))
    dims = filter_tensor.shape.as_list()
    return float(math.prod(dims[:-2]))


def _einsum_flops(op) -> float:
    """2 x output elements x the size of every label summed over; one operand: its elements."""
    equation = op.get_attr("equation").decode().replace(" ", "")
    inputs_text, _, output_text = equation.partition("->")
    operands = inputs_text.split(",")
    if len(operands) != 2:
        return elements(op.inputs[0])
    sizes = {}
    for labels, tensor in zip(operands, op.inputs):
        labels = labels.replace("...", "")
        dims = tensor.shape.as_list()
        for label, size in zip(labels, dims[len(dims) - len(labels) :]):
            sizes[label] = size
    summed = math.prod(sizes[label] for label in set(sizes) - set(output_text))
    return 2.0 * elements(op.outputs[0]) * summed


def _formula_flops(op) -> float | None:
    """devprof's stated formula for op types TensorFlow has no statistic for; None: not known."""
    t = op.type
    base = t[len("Resource") :] if t.startswith("ResourceApply") else t
    if t in ELEMENTWISE:  # an update in place (AssignAddVariableOp) has no output: its value's elements
        return (
            elements(op.outputs[0]) if op.outputs else max(elements(x) for x in op.inputs if x.dtype.name != "resource")
        )
    if t in REDUCTIONS:
        return elements(op.inputs[0])
    if t in PER_ELEMENT:
        return PER_ELEMENT[t] * elements(op.inputs[0])
    if t in BATCH_NORM:
        per = BATCH_NORM_TRAINING if op.get_attr("is_training") else BATCH_NORM_INFERENCE
        return per * elements(op.inputs[0])
    if t in BATCH_NORM_GRAD:
        return BATCH_NORM_BACKWARD * elements(op.inputs[1])
    if base in OPTIMIZER_UPDATES:
        values = [elements(x) for x in op.inputs if x.dtype.name != "resource"]
        return OPTIMIZER_UPDATES[base] * max(values)
    if t in ("Conv2DBackpropInput", "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropInput"):
        # As the forward convolution: 2 x the forward output's elements x the filter's window x its input depth.
        in_depth = 1 if t.startswith("Depthwise") else op.inputs[1].shape.as_list()[-2]
        return 2.0 * elements(op.inputs[2]) * _kernel_volume(op, op.inputs[1]) * in_depth
    if t in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter"):
        in_depth = 1 if t.startswith("Depthwise") else op.outputs[0].shape.as_list()[-2]
        return 2.0 * elements(op.inputs[2]) * _kernel_volume(op, op.outputs[0]) * in_depth
    if t in ("MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "MaxPoolGradGrad"):
        return _kernel_volume(op) * elements(op.outputs[0])
    if t in ("MaxPoolGrad", "MaxPool3DGrad"):  # the forward pool again, and 1 per forward output element
        return (_kernel_volume(op) + 1) * elements(op.inputs[1])
    if t in ("AvgPoolGrad", "AvgPool3DGrad"):  # a multiply and an add per window element of each gradient
        return 2 * _kernel_volume(op) * elements(op.inputs[1])
    if t == "Einsum":
        return _einsum_flops(op)
    return None


def op_flops(op) -> tuple[float, str, str]:
    """(FLOPs of one execution, flops_source, kind)."""
    t = op.type
    if t in NO_ARITHMETIC:
        return 0.0, SOURCE_NONE, KIND_NONE
    kind = KIND_MATRIX if is_matrix(t) else KIND_VECTOR
    counted = [x for x in (*op.inputs, *op.outputs) if x.dtype.name not in ("resource", "variant", "string")]
    if not all(x.shape.is_fully_defined() for x in counted):  # an op that computes, by how much is not known
        return NAN, SOURCE_UNKNOWN, kind if kind == KIND_MATRIX or _computes(t) else KIND_NONE
    value = _tensorflow_flops(op)
    if value is not None and math.isfinite(value):
        return value, SOURCE_TENSORFLOW, kind
    value = _formula_flops_safe(op)
    if value is not None and math.isfinite(value):
        return value, SOURCE_FORMULA, kind
    return NAN, SOURCE_UNKNOWN, KIND_NONE


FORMULA_TYPES = (
    ELEMENTWISE
    | REDUCTIONS
    | BATCH_NORM
    | BATCH_NORM_GRAD
    | frozenset(PER_ELEMENT)
    | frozenset(f"{prefix}{name}" for name in OPTIMIZER_UPDATES for prefix in ("", "Resource"))
    | frozenset(
        "MaxPool AvgPool MaxPool3D AvgPool3D MaxPoolGradGrad MaxPoolGrad MaxPool3DGrad "
        "AvgPoolGrad AvgPool3DGrad Conv3DBackpropInputV2 Conv3DBackpropFilterV2".split()
    )
)


def _computes(op_type: str) -> bool:
    """Whether TensorFlow has a FLOPs statistic for the op type, or devprof a formula."""
    from tensorflow.python.framework import ops as tf_ops

    _tensorflow_flops_loaded()
    try:
        tf_ops._stats_registry.lookup(f"{op_type},flops")
    except LookupError:
        return op_type in FORMULA_TYPES
    return True


def _formula_flops_safe(op) -> float | None:
    try:
        value = _formula_flops(op)
    except Exception:  # noqa: BLE001 - an attribute or shape the formula cannot read: not known
        return None
    return None if value is None else float(value)


# ---------------------------------------------------------------- one graph


def graph_rows(graph) -> list[dict]:
    """One row per node of `graph`, in `OP_COST_COLUMNS` order; with chain_flops/chain_bytes on
    the nodes that end a fusable chain."""
    rows, by_name = [], {}
    for op in graph.get_operations():
        flops, source, kind = op_flops(op)
        row = {
            "function": graph.name,
            "op": op.name,
            "type": op.type,
            "dtype": op_dtype(op),
            "kind": kind,
            "input_shapes": columns.SHAPE_SEPARATOR.join(shape_text(t.shape) for t in op.inputs),
            "output_shapes": columns.SHAPE_SEPARATOR.join(shape_text(t.shape) for t in op.outputs),
            "flops": flops,
            "bytes": op_bytes(op),
            "flops_source": source,
            "chain_flops": NAN,
            "chain_bytes": NAN,
        }
        rows.append(row)
        by_name[op.name] = row
    for chain in fusable_chains(graph):
        inside = {t.ref() for op in chain for t in op.outputs}
        external = sum(tensor_bytes(t) for op in chain for t in op.inputs if t.ref() not in inside)
        last = chain[-1]
        row = by_name[last.name]
        row["chain_flops"] = sum(by_name[op.name]["flops"] for op in chain)
        row["chain_bytes"] = external + sum(tensor_bytes(t) for t in last.outputs)
    return rows


def _only_consumer(op, consumer) -> bool:
    return [c.name for c in op.outputs[0].consumers()] == [consumer.name]


def fusable_chains(graph) -> list[list]:
    """Each [matrix op, BiasAdd or inference batch norm] and [..., activation] Grappler can fuse:
    every intermediate result used by the next node alone."""
    chains = []
    middles = {}
    for op in graph.get_operations():
        if not op.inputs:
            continue
        source = op.inputs[0].op
        if op.type == "BiasAdd" or (
            op.type in BATCH_NORM and not op.get_attr("is_training") and source.type != "MatMul"
        ):
            if source.type in FUSABLE_MATRIX and _only_consumer(source, op):
                middles[op.name] = [source, op]
                chains.append(middles[op.name])
    for op in graph.get_operations():
        if op.type in FUSABLE_ACTIVATIONS and op.inputs:
            before = middles.get(op.inputs[0].op.name)
            if before is not None and _only_consumer(before[-1], op):
                chains.append([*before, op])
    return chains


def has_arithmetic(rows: list[dict]) -> bool:
    return any(row["kind"] != KIND_NONE for row in rows)


# ---------------------------------------------------------------- the program's graphs


def live_graphs() -> list:
    """The program's traced function graphs (also while/cond bodies and tf.data functions)."""
    if "tensorflow" not in sys.modules:  # nothing traced yet, and no reason to load TensorFlow
        return []
    from tensorflow.python.framework.func_graph import FuncGraph

    return [obj for obj in gc.get_objects() if isinstance(obj, FuncGraph)]


def graph_ids() -> frozenset[int]:
    """The graphs alive now: what a recording started beside, to tell its own graphs from them."""
    return frozenset(id(graph) for graph in live_graphs())


def recorded_graphs(before: frozenset[int] | None) -> list:
    """The graphs of this recording: those traced since `before` was taken, and of the older ones
    those whose function was not traced again (a step function warmed up before the recording).
    A long-lived process (a notebook, a test session) holds other runs' graphs of the same function
    name, with other shapes; their costs are not this run's."""
    graphs = live_graphs()
    if before is None:
        return graphs
    new = [graph for graph in graphs if id(graph) not in before]
    traced_again = {graph.name for graph in new}
    return new + [graph for graph in graphs if id(graph) in before and graph.name not in traced_again]


def collect(graphs=None):
    """The cost table (a DataFrame in `OP_COST_COLUMNS` order) of every graph with arithmetic.

    A function traced more than once (another input shape, Keras's first trace that creates the
    variables) has one row per node name: the one whose costs are known, of the larger FLOPs
    (full batches; a partial last batch traces a smaller copy).
    """
    import pandas as pd

    rows = []
    for graph in live_graphs() if graphs is None else graphs:
        try:
            found = graph_rows(graph)
        except Exception:  # noqa: BLE001 - a graph being built or torn down meanwhile: the others still count
            continue
        if has_arithmetic(found):
            rows.extend(found)
    frame = pd.DataFrame(rows, columns=OP_COST_COLUMNS)
    if frame.empty:
        return frame
    known = frame["flops"].notna().astype(int) + frame["bytes"].notna().astype(int)
    order = pd.DataFrame({"known": known, "flops": frame["flops"].fillna(-1.0)})
    ranked = order.sort_values(["known", "flops"], ascending=False, kind="stable").index
    frame = frame.loc[ranked].drop_duplicates(["function", "op"], keep="first")
    return frame.sort_index().reset_index(drop=True)


def write(run_dir: str | Path, graphs=None, before: frozenset[int] | None = None) -> dict:
    """Collect the costs (of `graphs`, else of this recording's: `recorded_graphs(before)`) and write
    `<run_dir>/op_costs.csv` (temporary file + rename): returns {"op_costs_seconds",
    "op_costs_functions", "op_costs_ops"}."""
    began = time.perf_counter()
    frame = collect(recorded_graphs(before) if graphs is None else graphs)
    path = Path(run_dir) / OP_COSTS_CSV
    fd, temporary = tempfile.mkstemp(prefix=".op_costs.", suffix=".tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            frame.to_csv(handle, index=False, na_rep="", float_format="%.17g", lineterminator="\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return {
        "op_costs_seconds": time.perf_counter() - began,
        "op_costs_functions": int(frame["function"].nunique()),
        "op_costs_ops": len(frame),
    }
