"""The ops that take a step's time: one row per op (name and type) and device.

On a GPU or TPU each kernel belongs to the op that launched it (its `tf_op` stat,
"name:Type"); XLA programs from JAX say only "XlaModule:", and there the kernel's
`hlo_op` (else its own name) is the op. On a CPU-only trace the ops are TensorFlow's
host op events ("scope/name:Type") off tf.data's threads, each counted for its own
time, without the ops nested in it on the same thread. Times are per training step over the steady steps.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from analysis import producers
from analysis.producers import tensorflow as tf_producer
from analysis.read.view import NS_PER_MS, TraceView, matches, thread_nesting
from analysis.steps.host import TF_OP_RE

OP_COLUMNS = ["op", "type", "device", "count_per_step", "ms_per_step", "compute_pct"]
# Kept beside the reported columns for the roofline: which XLA program an HLO op belongs to (its
# names repeat across programs), how often the op itself ran (an op may launch several kernels
# each time) and the kernel that took most of its time.
OP_KEYS = ["program_id", "executions_per_step", "kernel"]
_FRAME_COLUMNS = ["op", "type", "device", "program_id", "kernel", "start_ns", "self_ns"]
XLA_MODULE = "XlaModule"


def _split_tf_op(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """ "scope/name:Type" -> ("scope/name", "Type"); anything else -> ("", "").

    Split once per distinct name: a trace repeats a few thousand op names over millions of events."""
    names = values.astype("category") if not isinstance(values.dtype, pd.CategoricalDtype) else values
    categories = names.cat.categories.astype(str)
    parts = [name.rpartition(":") for name in categories]
    heads = np.array([p[0] for p in parts] + [""], dtype=object)
    tails = np.array([p[2] for p in parts] + [""], dtype=object)
    codes = names.cat.codes.to_numpy()  # -1 (missing) picks the trailing ""
    return heads[codes], tails[codes]


def device_ops(view: TraceView) -> pd.DataFrame:
    """Device kernels with the op that launched them: `op`, `type`, `device`, `program_id` (NaN: not
    XLA's), `kernel`, `start_ns`, `self_ns`."""
    kernels = view.device
    if kernels.empty:
        return pd.DataFrame(columns=_FRAME_COLUMNS)
    name, kind = _split_tf_op(kernels["tf_op"])
    framework = (kind != "") & (kind != XLA_MODULE) & (name != "")
    hlo = kernels["hlo_op"].astype(object).fillna("").astype(str)
    kernel_name = kernels["name"].astype(str)
    op = np.where(framework, name, np.where(hlo != "", hlo, kernel_name))
    op_type = np.where(framework, kind, np.where(hlo != "", "XLA", "kernel"))
    program = (
        kernels["program_id"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
        if "program_id" in kernels
        else np.full(len(kernels), np.nan)
    )
    return pd.DataFrame(
        {
            "op": op,
            "type": op_type,
            "device": kernels["plane_name"].astype(str).to_numpy(),
            "program_id": np.where(op_type == "XLA", program, np.nan),
            "kernel": kernel_name.to_numpy(),
            "start_ns": kernels["start_ns"].to_numpy(),
            "self_ns": kernels["duration_ns"].to_numpy(),
        }
    )


# XLA's CPU runtime runs a compiled program as thunks, one event per HLO instruction ("convolution.1",
# "transpose_copy_fusion.1") inside `ThunkExecutor::Execute`, on the calling thread and the Eigen pool's.
XLA_CPU_THUNKS = "ThunkExecutor::Execute"
_NOT_A_THUNK = re.compile(r"::|^end: |^$")  # the runtime's own events and its end markers


def xla_cpu_thunks(host: pd.DataFrame) -> pd.DataFrame:
    """Events of XLA CPU programs' instructions: nested in a `ThunkExecutor::Execute` on its thread."""
    executors = host[host["name"] == XLA_CPU_THUNKS]
    if executors.empty:
        return host.iloc[:0]
    thread = (host["plane"].to_numpy(dtype=np.int64) << 32) + host["line"].to_numpy(dtype=np.int64)
    spans = executors.assign(
        _thread=(executors["plane"].to_numpy(dtype=np.int64) << 32) + executors["line"].to_numpy(dtype=np.int64)
    ).sort_values(["_thread", "start_ns"])
    inside = np.zeros(len(host), dtype=bool)
    starts, ends = host["start_ns"].to_numpy(dtype=np.int64), host["end_ns"].to_numpy(dtype=np.int64)
    for key, group in spans.groupby("_thread", sort=False):
        mine = np.flatnonzero(thread == key)
        span_starts = group["start_ns"].to_numpy(dtype=np.int64)
        span_ends = group["end_ns"].to_numpy(dtype=np.int64)
        at = np.searchsorted(span_starts, starts[mine], side="right") - 1
        ok = at >= 0
        inside[mine[ok]] = ends[mine[ok]] <= span_ends[at[ok]]
    names = host["name"].astype(str)
    return host[inside & ~matches(names, _NOT_A_THUNK, search=True) & ~matches(names, TF_OP_RE)]


def host_ops(view: TraceView) -> pd.DataFrame:
    """TensorFlow op events on host threads, each with its self time (nested ops on its thread left out);
    an XLA-compiled function's op gives way to its program's instructions where the trace has them."""
    host = view.host
    input_pipeline = re.compile(tf_producer.INPUT_PIPELINE_FUNCTION, re.IGNORECASE)
    # tf.data runs its functions' ops on its own threads: input, not the step's compute.
    ops = host[
        matches(host["name"], TF_OP_RE)
        & ~matches(host["line_name"], input_pipeline, search=True)
        & ~matches(host["name"], producers.pattern("collective"), search=True)
    ]  # waiting, not compute
    thunks = xla_cpu_thunks(host)
    if not thunks.empty:
        ops = _without_compiled_calls(ops, host[host["name"] == XLA_CPU_THUNKS])
        thunks = thunks.assign(name=thunks["name"].astype(str) + ":XLA")
        ops = pd.concat([ops, thunks])
    if ops.empty:
        return pd.DataFrame(columns=_FRAME_COLUMNS)
    ops, parent = thread_nesting(ops)
    name, kind = _split_tf_op(ops["name"])
    return pd.DataFrame(
        {
            "op": name,
            "type": kind,
            "device": ops["plane_name"].astype(str).to_numpy(),
            "program_id": np.nan,
            "kernel": kind,
            "start_ns": ops["start_ns"].to_numpy(),
            "self_ns": _self_ns(ops, parent),
        }
    )


def _without_compiled_calls(ops: pd.DataFrame, executors: pd.DataFrame) -> pd.DataFrame:
    """`ops` less the function calls that ran an XLA program (a thunk executor inside them on their
    thread): their time is their instructions', counted once."""
    keep = np.ones(len(ops), dtype=bool)
    op_thread = (ops["plane"].to_numpy(dtype=np.int64) << 32) + ops["line"].to_numpy(dtype=np.int64)
    run_thread = (executors["plane"].to_numpy(dtype=np.int64) << 32) + executors["line"].to_numpy(dtype=np.int64)
    run_starts = executors["start_ns"].to_numpy(dtype=np.int64)
    starts, ends = ops["start_ns"].to_numpy(dtype=np.int64), ops["end_ns"].to_numpy(dtype=np.int64)
    for i in range(len(ops)):
        same = run_thread == op_thread[i]
        keep[i] = not ((run_starts[same] >= starts[i]) & (run_starts[same] < ends[i])).any()
    return ops[keep]


def _self_ns(ops: pd.DataFrame, parent: np.ndarray) -> np.ndarray:
    """Duration minus the direct children on the same thread (`thread_nesting`'s order and parents)."""
    starts = ops["start_ns"].to_numpy(dtype=np.int64)
    ends = ops["end_ns"].to_numpy(dtype=np.int64)
    self_ns = ends - starts
    child = np.flatnonzero(parent >= 0)
    np.subtract.at(self_ns, parent[child], np.minimum(ends[child], ends[parent[child]]) - starts[child])
    return np.maximum(self_ns, 0)


def op_table(view: TraceView, steps: pd.DataFrame, device: str) -> pd.DataFrame:
    """Ops inside `steps` (their `start_ns`/`end_ns`), per training step, biggest first: `OP_COLUMNS`
    and `OP_KEYS`."""
    ops = host_ops(view) if device == "cpu" else device_ops(view)
    if ops.empty or steps.empty:
        return pd.DataFrame(columns=OP_COLUMNS + OP_KEYS)
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    order = np.argsort(starts)
    index = np.searchsorted(starts[order], ops["start_ns"].to_numpy(dtype=np.int64), side="right") - 1
    inside = (index >= 0) & (ops["start_ns"].to_numpy() < ends[order][np.clip(index, 0, None)])
    ops = ops[inside]
    training_steps = float(steps["steps"].sum()) if "steps" in steps else float(len(steps))
    keys = ["op", "type", "device", "program_id"]
    per_kernel = (
        ops.groupby([*keys, "kernel"], sort=False, dropna=False)
        .agg(count=("self_ns", "size"), ns=("self_ns", "sum"))
        .reset_index()
    )
    table = (
        per_kernel.groupby(keys, sort=False, dropna=False)
        .agg(count=("count", "sum"), ns=("ns", "sum"), executions=("count", "max"))
        .reset_index()
    )
    # Each execution of an op launches each of its kernels once: its executions are its most frequent kernel's.
    biggest = per_kernel.sort_values("ns", ascending=False, kind="stable").drop_duplicates(keys)
    table = table.merge(biggest[[*keys, "kernel"]], on=keys, how="left", sort=False)
    total = float(table["ns"].sum())
    table["count_per_step"] = table["count"] / training_steps
    table["executions_per_step"] = table["executions"] / training_steps
    table["ms_per_step"] = table["ns"] / NS_PER_MS / training_steps
    table["compute_pct"] = 100.0 * table["ns"] / total if total > 0 else 0.0
    return table.sort_values("ms_per_step", ascending=False, kind="stable")[OP_COLUMNS + OP_KEYS].reset_index(drop=True)


# TensorFlow's own (Eigen) kernels for the dense math of a CPU step; with oneDNN's kernels on,
# the same ops run as `_Mkl...` types instead.
EIGEN_DENSE_TYPE = re.compile(
    r"^(Conv[23]D(BackpropInput|BackpropFilter)?(V2)?|_FusedConv2D|"
    r"DepthwiseConv2dNative(BackpropInput|BackpropFilter)?|MatMul|BatchMatMul(V2|V3)?|_FusedMatMul)$"
)


def eigen_dense_pct(ops: pd.DataFrame) -> float:
    """Share of a CPU step's op time in Eigen's convolution and matmul kernels (NaN: no ops, or
    oneDNN's kernels ran)."""
    if ops.empty or ops["ms_per_step"].sum() <= 0:
        return math.nan
    types = ops["type"].astype(str)
    if types.str.startswith("_Mkl").any():
        return math.nan
    return float(100.0 * ops.loc[types.str.match(EIGEN_DENSE_TYPE), "ms_per_step"].sum() / ops["ms_per_step"].sum())
