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

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.read.view import NS_PER_MS, matches
from analysis.producers import tensorflow as tf_producer

STAGE_RE = re.compile(tf_producer.INPUT_STAGE)
ROOT = tf_producer.INPUT_ROOT
SHARD_RE = re.compile(tf_producer.INPUT_SHARD)
PREFETCH_RE = re.compile(tf_producer.INPUT_PREFETCH)


def stage_events(events: pd.DataFrame) -> pd.DataFrame:
    """`Iterator::` events other than the bare root, with a `depth` column."""
    stages = events.loc[matches(events["name"], STAGE_RE), ["name", "plane", "line", "start_ns", "end_ns",
                                                            "duration_ns"]]
    names = stages["name"].astype(str).astype("category") if not isinstance(stages["name"].dtype, pd.CategoricalDtype) \
        else stages["name"].cat.remove_unused_categories()
    stages = stages[(names != ROOT).to_numpy()]
    names = names[(names != ROOT).to_numpy()].cat.remove_unused_categories()
    # Per distinct stage name, not per event: a stage repeats once per batch.
    categories = names.cat.categories.astype(str)
    codes = names.cat.codes.to_numpy()
    depth = np.array([name.count("::") for name in categories], dtype=np.int64)[codes]
    return stages.assign(name=np.asarray(categories, dtype=object)[codes], depth=depth)


def _inside(starts, ends, span_starts, span_ends) -> np.ndarray:
    """Whether each [start, end) lies within one of the disjoint spans (one thread's stages)."""
    order = np.argsort(span_starts, kind="stable")
    span_starts, span_ends = span_starts[order], span_ends[order]
    index = np.searchsorted(span_starts, starts, side="right") - 1
    found = index >= 0
    result = np.zeros(starts.size, dtype=bool)
    result[found] = ends[found] <= span_ends[index[found]]
    return result


def stage_self_ns(events: pd.DataFrame, stages: pd.DataFrame | None = None) -> pd.Series:
    """Total self time of each stage name, in ns (see the module docstring); `stages` is
    `stage_events(events)` when the caller has it already."""
    stages = stage_events(events) if stages is None else stages
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
    forwarding = _forwarding(events, stages)
    self_ns[forwarding] = 0
    return pd.Series(self_ns, index=stages.index).groupby(stages["name"].to_numpy()).sum()


def _forwarding(events: pd.DataFrame, stages: pd.DataFrame) -> np.ndarray:
    """`Generator` stages that only forward a multi-device iterator's shard (tf.distribute): while
    its buffer is full they wait for the training loop, so all their time is waiting."""
    is_generator = stages["name"].str.endswith("::Generator").to_numpy()
    shards = events[matches(events["name"], SHARD_RE)]
    if not is_generator.any() or shards.empty:
        return np.zeros(len(stages), dtype=bool)
    order = np.sort(shards["start_ns"].to_numpy(dtype=np.int64))
    starts = stages["start_ns"].to_numpy(dtype=np.int64)
    ends = stages["end_ns"].to_numpy(dtype=np.int64)
    first_after = np.searchsorted(order, starts, side="left")
    holds_shard = (first_after < order.size) & (order[np.clip(first_after, 0, order.size - 1)] < ends)
    return is_generator & holds_shard


def prefetches(events: pd.DataFrame) -> bool | None:
    """Whether the traced pipeline prefetches (None when the trace has no tf.data stages)."""
    stages = stage_events(events)
    if stages.empty:
        return None
    return bool(stages["name"].str.contains(PREFETCH_RE).any())


def slowest_input_stage(events: pd.DataFrame, steps: int) -> str | None:
    return slowest_in_table(input_stage_table(events), steps)


def slowest_in_table(table: pd.DataFrame, steps: int) -> str | None:
    """The stage of `input_stage_table` with the most self time in all, with its self time per step."""
    if table.empty:
        return None
    total_ms = table["ms_per_batch"] * table["calls"]
    slowest = int(total_ms.to_numpy().argmax())
    per_step_ms = float(total_ms.iloc[slowest]) / max(steps, 1)
    return f"{table['stage'].iloc[slowest]} ({per_step_ms:.2f} ms self time per step)"


def input_stage_table(events: pd.DataFrame) -> pd.DataFrame:
    """`stage`, `ms_per_batch` (self time per call of the stage), `calls`: slowest first."""
    stages = stage_events(events)
    if stages.empty:
        return pd.DataFrame(columns=["stage", "ms_per_batch", "calls"])
    self_ns = stage_self_ns(events, stages)
    calls = stages.groupby("name").size().reindex(self_ns.index)
    table = pd.DataFrame({"stage": self_ns.index, "ms_per_batch": self_ns.to_numpy() / NS_PER_MS / calls.to_numpy(),
                          "calls": calls.to_numpy()})
    return table.sort_values("ms_per_batch", ascending=False, kind="stable").reset_index(drop=True)


PY_FUNCTION_RE = re.compile(tf_producer.PY_FUNCTION)


def runs_python(events: pd.DataFrame, stage: str | None) -> bool:
    """Whether Python functions (py_function, numpy_function) run for the stage: a call that the
    stage's span is the tightest of all stage spans around (tf.data runs the call on a pool thread)."""
    name = (stage or "").split(" (")[0]
    calls = events[matches(events["name"], PY_FUNCTION_RE, search=True)]
    stages = stage_events(events)
    if not name or calls.empty or stages.empty:
        return False
    starts = stages["start_ns"].to_numpy(dtype=np.int64)
    ends = stages["end_ns"].to_numpy(dtype=np.int64)
    names = stages["name"].to_numpy()
    for call_start, call_end in zip(calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy()):
        around = np.flatnonzero((starts <= call_start) & (ends >= call_end))
        if around.size and names[around[np.argmin(ends[around] - starts[around])]] == name:
            return True
    return False
