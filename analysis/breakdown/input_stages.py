"""The tf.data stages of a trace (`Iterator::...` events) and the time each one takes itself.

A stage's self time is its duration minus the time covered by

- deeper stages nested in it on the same thread (its input, pulled inline), and
- stages that are not its own inputs running on other threads within its span: a stage
  that only forwards another pipeline's output (the `Generator` that `tf.distribute` wraps
  around the real pipeline) is waiting, not working; a `Generator` that hands out a
  multi-device iterator's shard (`GetNextFromShard`) waits all its time.

Its own inputs on other threads (a prefetch's or a parallel map's workers, whose names
extend the stage's name) are not subtracted: they run beside the stage, not inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.producers import tensorflow as tf_producer
from analysis.read.view import NS_PER_MS, TraceView

SHARD_RE = re.compile(tf_producer.INPUT_SHARD)
PREFETCH_RE = re.compile(tf_producer.INPUT_PREFETCH)


def _inside(starts, ends, span_starts, span_ends) -> np.ndarray:
    """Whether each [start, end) lies within one of the disjoint spans (one thread's stages)."""
    order = np.argsort(span_starts, kind="stable")
    span_starts, span_ends = span_starts[order], span_ends[order]
    index = np.searchsorted(span_starts, starts, side="right") - 1
    found = index >= 0
    result = np.zeros(starts.size, dtype=bool)
    result[found] = ends[found] <= span_ends[index[found]]
    return result


def stage_self_ns(view: TraceView) -> pd.Series:
    """Total self time of each stage name, in ns (see the module docstring)."""
    stages = view.stages
    if stages.empty:
        return pd.Series(dtype="int64")
    self_ns = np.zeros(len(stages), dtype=np.int64)
    starts = stages["start_ns"].to_numpy(dtype=np.int64)
    ends = stages["end_ns"].to_numpy(dtype=np.int64)
    thread = stages["plane"].astype(np.int64).to_numpy() * 1_000_000 + stages["line"].astype(np.int64).to_numpy()
    depth = stages["depth"].to_numpy()
    names = stages["name"].to_numpy()
    categories = pd.Categorical(names)
    codes = categories.codes
    for key in np.unique(np.stack([thread, depth]).T, axis=0):
        mine = (thread == key[0]) & (depth == key[1])
        nested = (thread == key[0]) & (depth > key[1])
        for name in np.unique(names[mine]):
            group = mine & (names == name)
            # Stages on other threads that are not this stage's own inputs (names extending its own).
            foreign = np.array([not other.startswith(name) for other in categories.categories], dtype=bool)[codes]
            elsewhere = np.flatnonzero((thread != key[0]) & foreign)
            waited = elsewhere[_inside(starts[elsewhere], ends[elsewhere], starts[group], ends[group])]
            covered = iv.union(np.concatenate([starts[nested], starts[waited]]),
                               np.concatenate([ends[nested], ends[waited]]))
            self_ns[group] = (ends[group] - starts[group]) - iv.overlap(covered, starts[group], ends[group])
    forwarding = _forwarding(view)
    self_ns[forwarding] = 0
    return pd.Series(self_ns, index=stages.index).groupby(stages["name"].to_numpy()).sum()


def _forwarding(view: TraceView) -> np.ndarray:
    """`Generator` stages that only forward a multi-device iterator's shard (tf.distribute): while
    its buffer is full they wait for the training loop, so all their time is waiting."""
    stages = view.stages
    is_generator = stages["name"].str.endswith("::Generator").to_numpy()
    shards = view.named(SHARD_RE)
    if not is_generator.any() or shards.empty:
        return np.zeros(len(stages), dtype=bool)
    order = np.sort(shards["start_ns"].to_numpy(dtype=np.int64))
    starts = stages["start_ns"].to_numpy(dtype=np.int64)
    ends = stages["end_ns"].to_numpy(dtype=np.int64)
    first_after = np.searchsorted(order, starts, side="left")
    holds_shard = (first_after < order.size) & (order[np.clip(first_after, 0, order.size - 1)] < ends)
    return is_generator & holds_shard


@dataclass(frozen=True)
class SlowestStage:
    """The tf.data stage with the most self time in all, and whether it runs Python."""

    name: str
    ms_per_step: float
    runs_python: bool = False

    def __str__(self) -> str:
        return f"{self.name} ({self.ms_per_step:.2f} ms self time per step)"


@dataclass(frozen=True)
class InputStages:
    """A trace's tf.data stages: the table (`stage`, `ms_per_batch`, `calls`, slowest first), the
    slowest in all, and whether the pipeline prefetches (None: no stages traced)."""

    table: pd.DataFrame
    slowest: SlowestStage | None
    prefetches: bool | None


STAGE_COLUMNS = ["stage", "ms_per_batch", "calls"]


def input_stages(view: TraceView, steps: int) -> InputStages:
    """The stages of `view` over `steps` steps."""
    table = input_stage_table(view)
    slowest = slowest_in_table(table, steps)
    if slowest is not None:
        slowest = SlowestStage(slowest.name, slowest.ms_per_step, runs_python(view, slowest.name))
    return InputStages(table, slowest, prefetches(view))


def prefetches(view: TraceView) -> bool | None:
    """Whether the traced pipeline prefetches (None when the trace has no tf.data stages)."""
    stages = view.stages
    if stages.empty:
        return None
    return bool(stages["name"].str.contains(PREFETCH_RE).any())


def slowest_in_table(table: pd.DataFrame, steps: int) -> SlowestStage | None:
    """The stage of `input_stage_table` with the most self time in all, with its self time per step."""
    if table.empty:
        return None
    total_ms = table["ms_per_batch"] * table["calls"]
    slowest = int(total_ms.to_numpy().argmax())
    return SlowestStage(str(table["stage"].iloc[slowest]), float(total_ms.iloc[slowest]) / max(steps, 1))


def input_stage_table(view: TraceView) -> pd.DataFrame:
    """`stage`, `ms_per_batch` (self time per call of the stage), `calls`: slowest first."""
    stages = view.stages
    if stages.empty:
        return pd.DataFrame(columns=STAGE_COLUMNS)
    self_ns = stage_self_ns(view)
    calls = stages.groupby("name").size().reindex(self_ns.index)
    table = pd.DataFrame({"stage": self_ns.index, "ms_per_batch": self_ns.to_numpy() / NS_PER_MS / calls.to_numpy(),
                          "calls": calls.to_numpy()})
    return table.sort_values("ms_per_batch", ascending=False, kind="stable").reset_index(drop=True)


PY_FUNCTION_RE = re.compile(tf_producer.PY_FUNCTION)


def runs_python(view: TraceView, stage: str) -> bool:
    """Whether Python functions (py_function, numpy_function) run for the stage: a call that the
    stage's span is the tightest of all stage spans around (tf.data runs the call on a pool thread)."""
    calls = view.named(PY_FUNCTION_RE, search=True)
    stages = view.stages
    if not stage or calls.empty or stages.empty:
        return False
    starts = stages["start_ns"].to_numpy(dtype=np.int64)
    ends = stages["end_ns"].to_numpy(dtype=np.int64)
    names = stages["name"].to_numpy()
    for call_start, call_end in zip(calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy()):
        around = np.flatnonzero((starts <= call_start) & (ends >= call_end))
        if around.size and names[around[np.argmin(ends[around] - starts[around])]] == stage:
            return True
    return False
