"""Ops executed eagerly: one at a time from Python, instead of inside a compiled `tf.function`.

TensorFlow's eager runtime records every call it runs from Python as `EagerLocalExecute: <name>`
(in every version from 2.4 on; newer ones add `EagerExecute` stats `eager_op` and `is_func`):
an op (`MatMul`, `LogicalAnd`) is eager work; a tf.function call names its concrete function
(`__inference_train_step_842`). The iterator's own ops (`IteratorGetNext`, `Optional...`) are
input, and left out of both.

Over the steady steps (from the first one's start to the last one's end, the gaps between them
included), `op_time_pct` is the eager ops' share of the host's op-execution time (eager ops plus
tf.function calls, each call whole: dispatch and the wait for its result included); `step_pct`
their share of that time, which is what the finding weighs. XProf's
overview page reports the share of op *self* time (`host_op_time_eager_percent`), so a
function call's dispatch, counted here, makes devprof's share of a mostly compiled step
higher than XProf's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import producers
from analysis.producers import tensorflow as tf_producer
from analysis.read.view import NS_PER_MS, TraceView, matches

EAGER_RE = re.compile(tf_producer.EAGER_EXECUTION)
FUNCTION_RE = re.compile(tf_producer.CONCRETE_FUNCTION)
ITERATOR_RE = re.compile(tf_producer.ITERATOR_OP)
TOP_OPS = 3


@dataclass(frozen=True)
class EagerOps:
    """Eager execution in the steady steps: shares, time per training step and the heaviest ops."""

    op_time_pct: float  # eager ops' share of host op-execution time (eager ops + tf.function calls)
    ms_per_step: float  # eager ops' time per training step
    step_pct: float  # of step time
    ops: tuple[tuple[str, float], ...]  # (op, ms per training step), heaviest first, at most TOP_OPS

    def as_dict(self) -> dict:
        return {"op_time_pct": self.op_time_pct, "ms_per_step": self.ms_per_step, "step_pct": self.step_pct,
                "ops": [{"op": op, "ms_per_step": ms} for op, ms in self.ops]}


def _op_names(names: pd.Series) -> pd.Series:
    """The op or function each `EagerLocalExecute: <name>` event ran (parsed once per distinct name)."""
    names = names.astype(str).astype("category")
    parsed = {name: found.group(1) for name in names.cat.categories
              if (found := EAGER_RE.match(str(name))) is not None}
    return names.map(parsed).astype(str)


def eager_ops(view: TraceView | None, steps: pd.DataFrame) -> EagerOps | None:
    """Eager execution inside `steps` (their `start_ns`, `end_ns`, `steps`); None without a trace,
    steps, or any eager call in them."""
    if view is None or steps.empty or view.host.empty:
        return None
    calls = view.host[matches(view.host["name"], EAGER_RE)]
    if calls.empty:
        return None
    op = _op_names(calls["name"])
    is_input = matches(op, ITERATOR_RE, search=True) | matches(op, producers.pattern("host_input"))
    is_function = matches(op, FUNCTION_RE, search=True)
    # The steady steps' stretch of the loop, gaps between steps included: an eager op the loop runs
    # after each compiled call (Keras' checks between `train_function` calls) lies between the
    # trace's step groups.
    starts = np.array([steps["start_ns"].min()], dtype=np.int64)
    ends = np.array([steps["end_ns"].max()], dtype=np.int64)
    eager = calls[~is_input & ~is_function]
    eager_spans = iv.union(eager["start_ns"].to_numpy(), eager["end_ns"].to_numpy())
    functions = calls[is_function]
    function_spans = iv.subtract(iv.union(functions["start_ns"].to_numpy(), functions["end_ns"].to_numpy()),
                                 eager_spans)
    eager_ns = int(iv.overlap(eager_spans, starts, ends).sum())
    if eager_ns <= 0:
        return None
    function_ns = int(iv.overlap(function_spans, starts, ends).sum())
    training_steps = float(steps["steps"].sum()) if "steps" in steps else float(len(steps))
    step_ns = int((ends - starts).sum())
    # The heaviest ops: each call that starts inside the stretch, whole.
    at = eager["start_ns"].to_numpy(dtype=np.int64)
    inside = (at >= starts[0]) & (at < ends[0])
    per_op = (eager[inside].groupby(op[~is_input & ~is_function][inside].to_numpy())["duration_ns"].sum()
              .sort_values(ascending=False, kind="stable"))
    top = tuple((str(name), float(ns) / NS_PER_MS / training_steps) for name, ns in per_op.head(TOP_OPS).items())
    return EagerOps(op_time_pct=100.0 * eager_ns / (eager_ns + function_ns),
                    ms_per_step=eager_ns / NS_PER_MS / training_steps,
                    step_pct=100.0 * eager_ns / step_ns if step_ns > 0 else 0.0, ops=top)
