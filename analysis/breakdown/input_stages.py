"""The tf.data stages of a trace (`Iterator::...` events) and the time each one takes itself.

A stage works only while nothing it waits for runs. Its self time is its duration minus the
time covered by

- deeper stages nested in it on the same thread (its input, pulled inline);
- its own inputs running on other threads within its span (names that extend its own): a parallel
  map or interleave waits for what its runner threads pull, it does not work meanwhile;
- stages that are not its inputs (nor its consumers) running on other threads within its span: a
  stage that only forwards another pipeline's output (the `Generator` that `tf.distribute` wraps
  around the real pipeline) is waiting, not working.

A `Prefetch` waits all its time (it hands over what its producer thread made, whether or not the
trace shows that thread working), and so does a `Generator` that hands out a multi-device
iterator's shard (`GetNextFromShard`).

A map's function runs on a pool thread with no stage of its own, so its time stays the map's.

Per step, the stages are counted over the steps the mean is taken of, and each stage's share of
the step's wait for its batch (`wait_ms_per_step`, the time the loop waits while the stage works)
is bounded by that wait: the slowest stage is the one that holds the wait.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.producers import tensorflow as tf_producer
from analysis.read.view import NS_PER_MS, TraceView, intervals

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


def _extends(name: str, prefix: str) -> bool:
    """Whether stage `name` is an input of stage `prefix` ("P::Map", or "P[0]::Map" under "P")."""
    return name.startswith(prefix + "::") or name.startswith(prefix + "[")


def _within(points: np.ndarray, window: iv.Intervals) -> np.ndarray:
    """Whether each point lies in one of the sorted, disjoint `window` intervals."""
    index = np.searchsorted(window[0], points, side="right") - 1
    found = index >= 0
    result = np.zeros(points.size, dtype=bool)
    result[found] = points[found] < window[1][index[found]]
    return result


@dataclass(frozen=True)
class StageTimes:
    """Each stage event's self time (ns, aligned with `view.stages`) and each stage name's self-time
    intervals (when it worked)."""

    self_ns: np.ndarray
    working: dict[str, iv.Intervals]


def stage_times(view: TraceView) -> StageTimes:
    """The self time of every stage event (see the module docstring); worked out once per view."""
    return view.query(_stage_times)


def _stage_times(view: TraceView) -> StageTimes:
    stages = view.stages
    if stages.empty:
        return StageTimes(np.zeros(0, dtype=np.int64), {})
    self_ns = np.zeros(len(stages), dtype=np.int64)
    starts = stages["start_ns"].to_numpy(dtype=np.int64)
    ends = stages["end_ns"].to_numpy(dtype=np.int64)
    thread = stages["plane"].astype(np.int64).to_numpy() * 1_000_000 + stages["line"].astype(np.int64).to_numpy()
    depth = stages["depth"].to_numpy()
    names = stages["name"].to_numpy()
    categories = pd.Categorical(names)
    codes = categories.codes
    # A Prefetch only hands over what its producer thread made: its calls wait for that thread, traced
    # or not (a producer call in flight when the trace began is not in it).
    prefetch = np.array([stage_kind(name) == "Prefetch" for name in categories.categories], dtype=bool)[codes]
    only_waits = _forwarding(view) | prefetch
    pieces: dict[str, list[iv.Intervals]] = {}
    for key in np.unique(np.stack([thread, depth]).T, axis=0):
        mine = (thread == key[0]) & (depth == key[1])
        nested = (thread == key[0]) & (depth > key[1])
        other_thread = thread != key[0]
        for name in np.unique(names[mine]):
            group = mine & (names == name)
            inputs = np.array([_extends(other, name) for other in categories.categories], dtype=bool)[codes]
            consumers = np.array([_extends(name, other) for other in categories.categories], dtype=bool)[codes]
            # Its own inputs elsewhere: it waits for them wherever they overlap it.
            fed = other_thread & inputs
            # Another pipeline it forwards: only what runs wholly within its span.
            foreign = np.flatnonzero(other_thread & ~inputs & ~consumers & (names != name))
            waited = foreign[_inside(starts[foreign], ends[foreign], starts[group], ends[group])]
            covered = iv.union(
                np.concatenate([starts[nested], starts[fed], starts[waited]]),
                np.concatenate([ends[nested], ends[fed], ends[waited]]),
            )
            spans = iv.union(starts[group & ~only_waits], ends[group & ~only_waits])
            working = iv.subtract(spans, covered)
            self_ns[group] = iv.overlap(working, starts[group], ends[group])
            pieces.setdefault(name, []).append(working)
    self_ns[only_waits] = 0
    return StageTimes(self_ns, {name: iv.union_of(*parts) for name, parts in pieces.items()})


def stage_self_ns(view: TraceView) -> pd.Series:
    """Total self time of each stage name, in ns (see the module docstring)."""
    stages = view.stages
    if stages.empty:
        return pd.Series(dtype="int64")
    times = stage_times(view)
    return pd.Series(times.self_ns, index=stages.index).groupby(stages["name"].to_numpy()).sum()


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
    """The tf.data stage that holds the step's wait (the most self time in all where the trace has
    no wait), its self time per step (while the step waits, where it does) and whether it runs Python."""

    name: str
    ms_per_step: float
    runs_python: bool = False
    ms_per_batch: float = math.nan  # its own time per call, whether or not the step waits meanwhile

    def __str__(self) -> str:
        return f"{self.name} ({self.ms_per_step:.2f} ms self time per step)"

    @property
    def kind(self) -> str:
        return stage_kind(self.name)


@dataclass(frozen=True)
class InputStages:
    """A trace's tf.data stages: the table (`stage`, `ms_per_batch`, `calls`, `wait_ms_per_step`,
    slowest first), the slowest, and whether the pipeline prefetches (None: no stages traced)."""

    table: pd.DataFrame
    slowest: SlowestStage | None
    prefetches: bool | None


STAGE_COLUMNS = ["stage", "ms_per_batch", "calls", "wait_ms_per_step"]


def input_stages(view: TraceView, steps: pd.DataFrame) -> InputStages:
    """The stages of `view` over `steps` (`start_ns`, `end_ns`: the steps the mean is taken of)."""
    table = input_stage_table(view, steps)
    slowest = slowest_in_table(table, training_steps(_traced_steps(view, steps)))
    if slowest is not None:
        own = table.loc[table["stage"] == slowest.name, "ms_per_batch"]
        slowest = SlowestStage(
            slowest.name,
            slowest.ms_per_step,
            runs_python(view, slowest.name),
            float(own.iloc[0]) if len(own) else math.nan,
        )
    return InputStages(table, slowest, prefetches(view))


def training_steps(steps: pd.DataFrame) -> int:
    """How many training steps the rows hold (a row may be a call of several)."""
    if "steps" in steps and len(steps):
        return int(pd.to_numeric(steps["steps"], errors="coerce").fillna(1).clip(lower=1).sum())
    return len(steps)


# Stages that wrap a pipeline without transforming it: the one the loop reads from is below them.
ITERATOR_WRAPPERS = {
    "Iterator",
    "Root",
    "Model",
    "MaxIntraOpParallelism",
    "PrivateThreadPool",
    "Options",
    "ModelDataset",
}
# Stages that pass their input's elements on as they come, doing no work per element: a prefetch below
# them (`.prefetch(AUTOTUNE).take(n)`, `.repeat()`, `.shard()`) still has the next batch ready.
PASS_THROUGH = {"Take", "FiniteTake", "Repeat", "FiniteRepeat", "ForeverRepeat", "Skip", "FiniteSkip", "Shard"}


def prefetches(view: TraceView) -> bool | None:
    """Whether the stage the loop reads from is a prefetch (None when the trace has no tf.data stages):
    a slow stage after the prefetch (`...prefetch().map(slow)`) is not prefetched; a take, repeat, skip
    or shard after it passes the prefetched batches on."""
    stages = view.stages
    if stages.empty:
        return None
    names = stages["name"].drop_duplicates().astype(str)
    skipped = ITERATOR_WRAPPERS | PASS_THROUGH
    tops = {
        next((part.split("[")[0] for part in name.split("::") if part.split("[")[0] not in skipped), "")
        for name in names
    }
    tops.discard("")
    if not tops:
        return bool(names.str.contains(PREFETCH_RE).any())
    return "Prefetch" in tops


def stage_kind(name: str) -> str:
    """The kind of a stage from its name: "Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2" -> "BatchV2"."""
    return name.rsplit("::", 1)[-1].split("[")[0]


def stage_kinds(view: TraceView) -> tuple[str, ...] | None:
    """The kinds of stage the traced pipelines have, every part of every stage's name (None: no
    tf.data stages traced)."""
    stages = view.stages
    if stages.empty:
        return None
    parts = {part.split("[")[0] for name in pd.unique(stages["name"]) for part in str(name).split("::")[1:]}
    return tuple(sorted(parts - {"Root", "Model"}))


# What a kind of stage does, by the dataset names that stage names carry.
STAGE_FAMILIES = {
    "map": ("Map", "MapAndBatch", "ParallelMap", "ParallelMapV2"),
    "serial_map": ("Map", "MapAndBatch"),  # not known to run in parallel (a fused map and batch may not)
    "read_files": ("TFRecord", "TextLine", "FixedLengthRecord"),
    "parallel_interleave": (
        "ParallelInterleave",
        "ParallelInterleaveV2",
        "ParallelInterleaveV3",
        "ParallelInterleaveV4",
        "LegacyParallelInterleaveV2",
    ),
    "cache": ("Cache", "MemoryCache", "MemoryCacheImpl", "FileCache", "FileCacheImpl"),
    # stages that only hand on what their input makes: their time is a wait for it
    "pass_through": (
        "Prefetch",
        "Repeat",
        "ForeverRepeat",
        "Take",
        "Skip",
        "Options",
        "MaxIntraOpParallelism",
        "PrivateThreadPool",
        "AssertCardinality",
        "Rebatch",
        "Root",
        "Model",
    ),
}


def has_stage(kinds: tuple[str, ...], family: str) -> bool:
    """Whether a pipeline of these stage kinds has a stage of `family` (`STAGE_FAMILIES`)."""
    return any(kind in STAGE_FAMILIES[family] for kind in kinds)


def slowest_in_table(table: pd.DataFrame, steps: int) -> SlowestStage | None:
    """The first stage of `input_stage_table`: the time it holds the step's wait per step, or its self
    time per step where the trace has no wait."""
    if table.empty:
        return None
    first = table.iloc[0]
    wait_ms = float(first["wait_ms_per_step"])
    if wait_ms == wait_ms and wait_ms > 0:
        return SlowestStage(str(first["stage"]), wait_ms)
    return SlowestStage(str(first["stage"]), float(first["ms_per_batch"] * first["calls"]) / max(steps, 1))


def _traced_steps(view: TraceView, steps: pd.DataFrame) -> pd.DataFrame:
    """The steps from the first stage call on a thread other than the loop's: a call in flight when the
    trace began is not in it, so before that the wait's producer is not seen (all the steps if none)."""
    stages, waits = view.stages, view.input_waits
    if not len(steps) or waits.empty:
        return steps
    loop = set(zip(waits["plane"], waits["line"]))
    elsewhere = [
        start
        for plane, line, start in zip(stages["plane"], stages["line"], stages["start_ns"])
        if (plane, line) not in loop
    ]
    if not elsewhere:
        return steps
    later = steps[steps["start_ns"].to_numpy(dtype=np.int64) >= min(elsewhere)]
    return later if len(later) else steps


def _window(steps: pd.DataFrame) -> iv.Intervals:
    return iv.union(steps["start_ns"].to_numpy(dtype=np.int64), steps["end_ns"].to_numpy(dtype=np.int64))


def input_stage_table(view: TraceView, steps: pd.DataFrame) -> pd.DataFrame:
    """`stage`, `ms_per_batch` (self time per call), `calls`, `wait_ms_per_step` (the step's wait for its
    batch while the stage works, ms per step, at most the mean wait; NaN: the trace has no wait), the
    one holding the most of the wait first. Over the stage calls that start within `steps` once their
    producers are traced (`_traced_steps`); the wait's share that each holds there, times the mean wait
    of `steps`."""
    stages = view.stages
    if stages.empty:
        return pd.DataFrame(columns=STAGE_COLUMNS)
    times = stage_times(view)
    traced = _traced_steps(view, steps)
    window = _window(traced) if len(traced) else iv.empty()
    starts = stages["start_ns"].to_numpy(dtype=np.int64)
    within = _within(starts, window) if window[0].size else np.ones(len(stages), dtype=bool)
    if not within.any():
        within = np.ones(len(stages), dtype=bool)  # no stage call inside the steps: all the trace has
    names = stages["name"].to_numpy()[within]
    self_ns = pd.Series(times.self_ns[within]).groupby(names).sum()
    calls = pd.Series(names).value_counts().reindex(self_ns.index)
    waits = intervals(view.input_waits)
    waited = [math.nan] * len(self_ns)
    if waits[0].size and window[0].size:
        mean_wait_ns = iv.total(iv.intersect(waits, _window(steps))) / max(training_steps(steps), 1)
        held = iv.intersect(waits, window)
        if iv.total(held):
            waited = [
                mean_wait_ns
                * iv.total(iv.intersect(times.working.get(name, iv.empty()), held))
                / iv.total(held)
                / NS_PER_MS
                for name in self_ns.index
            ]
        else:
            waited = [0.0] * len(self_ns)
    table = pd.DataFrame(
        {
            "stage": self_ns.index,
            "ms_per_batch": self_ns.to_numpy() / NS_PER_MS / calls.to_numpy(),
            "calls": calls.to_numpy(),
            "wait_ms_per_step": waited,
        }
    )
    total = table["ms_per_batch"] * table["calls"]
    order = np.lexsort((-total.to_numpy(), -table["wait_ms_per_step"].fillna(0.0).to_numpy()))
    return table.iloc[order].reset_index(drop=True)


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
