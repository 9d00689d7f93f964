"""Where the memory goes: each allocator's peak in the traced window, what is live at it, each step's
peak and what it still holds at its end, the headroom for a larger batch; and from the samplers, the
process's and the devices' memory over the run and across epochs.

Pure: the trace view's allocator events (`TraceView.memory`), the steps, the sampler frames and the
run's batch size in, one `MemoryReport` out. Bytes in use after each event are the allocator's own
(`bytes_allocated` + `bytes_reserved`), so the peak is the largest of them: what XProf's Memory Profile
tool reports as the peak, to the byte. What is live at the peak is each allocation of the window not
freed before it (matched by address, as XProf does); the rest of the bytes in use were allocated before
the window, and are said to be, never given to an op. Each allocator's peak, what is live at it and
its steps are `memory_allocators`'s; what holds a peak, and the batch that would fit, `memory_holders`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.breakdown.memory_allocators import (
    NS_PER_MS,
    STEP_COLUMNS,
    TIMELINE_COLUMNS,
    AllocatorPeak,
    Live,
    _float_or_none,
    _grouped,
    _int_or_none,
    allocator_report,
    live_at,
)
from analysis.read.inputs import RunInputs
from analysis.read.run_files import TIME_COLUMN, RunRecord

# Across epochs (samplers): at least this many epochs, each ending higher than the one before (the
# first one's end is left out: caches and compiled graphs fill it), by this share of the first.
MIN_GROWTH_EPOCHS = 3
MIN_EPOCH_GROWTH_SHARE = 0.05


@dataclass(frozen=True)
class SampledMemory:
    """One sampler's memory over the run: the process's RSS (host) or a device's memory."""

    sampler: str  # host, gpu0, ...
    what: str  # what the column measures, in words
    column: str
    first_bytes: float
    last_bytes: float
    peak_bytes: float
    total_bytes: float  # the machine's or the device's memory (NaN: not sampled)
    min_available_bytes: float  # host: the machine's least available memory (NaN: not sampled)
    epoch_end_bytes: tuple[float, ...]  # at each epoch's end (empty: no epochs)
    growth_bytes_per_epoch: float  # NaN: not growing epoch after epoch, or too few epochs

    def as_dict(self) -> dict:
        return {
            "sampler": self.sampler,
            "what": self.what,
            "column": self.column,
            **{
                key: _int_or_none(getattr(self, key))
                for key in ("first_bytes", "last_bytes", "peak_bytes", "total_bytes", "min_available_bytes")
            },
            "epoch_end_bytes": [_int_or_none(v) for v in self.epoch_end_bytes],
            "growth_bytes_per_epoch": _float_or_none(self.growth_bytes_per_epoch),
        }


@dataclass(frozen=True)
class OomAtFailure:
    """The out-of-memory error that ended the run (run.json `oom`) and what held the memory then: the
    trace's allocator at its last event before the failure where the window covered it, else the
    samplers' last values before it."""

    bytes: int | None  # the allocation that failed (None: the message does not say)
    shape: tuple[int, ...] | None
    dtype: str | None
    op: str | None
    allocator: str | None
    device: str | None
    time_s: float  # when the error ended the run (Unix seconds; NaN: not recorded)
    source: str  # "trace", "samplers" or "none": where `held` comes from
    held_allocator: str | None = None  # trace: the allocator whose state is shown
    held_bytes: float = math.nan  # trace: its bytes in use at its last event before the failure
    capacity_bytes: float = math.nan  # trace: its capacity (bytes in use + available), NaN: not stated
    before_failure_ms: float = math.nan  # trace: how long before the failure that event was
    top: tuple[Live, ...] = ()  # trace: the largest groups live then
    sampled: tuple[tuple[str, str, float, float], ...] = ()  # samplers: (sampler, what, last bytes, total bytes)

    def as_dict(self) -> dict:
        return {
            "bytes": self.bytes,
            "shape": list(self.shape) if self.shape is not None else None,
            "dtype": self.dtype,
            "op": self.op,
            "allocator": self.allocator,
            "device": self.device,
            "source": self.source,
            "held_allocator": self.held_allocator,
            "held_bytes": _int_or_none(self.held_bytes),
            "capacity_bytes": _int_or_none(self.capacity_bytes),
            "before_failure_ms": _float_or_none(self.before_failure_ms),
            "top_at_failure": [live.as_dict() for live in self.top],
            "samplers": [
                {"sampler": s, "what": w, "last_bytes": _int_or_none(v), "total_bytes": _int_or_none(t)}
                for s, w, v, t in self.sampled
            ],
        }


@dataclass(frozen=True)
class WorkerMemory:
    """One worker's allocators in a job (or one host's in a profile session of several)."""

    worker: int | str | None  # None: a run of one worker
    allocators: tuple[AllocatorPeak, ...]
    steps: pd.DataFrame  # STEP_COLUMNS of its allocators

    def as_dict(self) -> dict:
        return {"worker": self.worker, "allocators": [a.as_dict(self.steps) for a in self.allocators]}


@dataclass(frozen=True)
class MemoryReport:
    """Every allocator of the trace and every sampled memory of the run (docs/json.md `memory`)."""

    allocators: tuple[AllocatorPeak, ...]
    timeline: pd.DataFrame  # TIMELINE_COLUMNS: every allocator event (memory.csv)
    steps: pd.DataFrame  # STEP_COLUMNS: per allocator and step
    sampled: tuple[SampledMemory, ...]
    batch_size: float  # NaN: not known
    oom: OomAtFailure | None = None  # the out-of-memory error that ended the run, if one did
    # Every worker's allocators, in worker order, where a job's (or a session's) workers were analysed;
    # empty for one worker's run, whose allocators are the report's own.
    workers: tuple[WorkerMemory, ...] = ()

    @property
    def every_worker(self) -> tuple[WorkerMemory, ...]:
        return self.workers or (WorkerMemory(None, self.allocators, self.steps),)

    def as_dict(self) -> dict:
        return {
            "allocators": [a.as_dict(self.steps) for a in self.allocators],
            "workers": [worker.as_dict() for worker in self.every_worker],
            "batch_size": _int_or_none(self.batch_size),
            "samplers": [s.as_dict() for s in self.sampled],
            "oom": self.oom.as_dict() if self.oom is not None else None,
        }


# The sampled memories: the process's RSS on the host; per GPU, TensorFlow's own figure where sampled,
# else the process's, else the whole device's.
SAMPLED_COLUMNS = {
    "host": (("proc_rss_bytes", "process RSS"),),
    "gpu": (
        ("tf_mem_current_bytes", "TensorFlow's GPU memory"),
        ("proc_mem_bytes", "the process's GPU memory"),
        ("mem_used_bytes", "GPU memory used"),
    ),
}


def epoch_ends_s(steps_table: pd.DataFrame | None) -> list[float]:
    """Each epoch's end on the samplers' clock, from steps.csv: the next epoch's first step, the last
    epoch's last step's end."""
    if steps_table is None or steps_table.empty:
        return []
    starts = steps_table.groupby("epoch")["start_time_s"].min().sort_index()
    last = steps_table.sort_values("start_time_s").iloc[-1]
    return [*starts.iloc[1:].tolist(), float(last["start_time_s"]) + float(last["step_ms"]) / 1000.0]


def epoch_growth(ends: list[float]) -> float:
    """Bytes per epoch where each epoch (the first one's end left out) ends higher than the one before,
    by `MIN_EPOCH_GROWTH_SHARE` of the first in all; NaN otherwise."""
    values = np.array([v for v in ends[1:] if v == v], dtype=np.float64)
    if len(ends) < MIN_GROWTH_EPOCHS or values.size < 2 or not (np.diff(values) > 0).all():
        return math.nan
    if values[-1] - values[0] < MIN_EPOCH_GROWTH_SHARE * values[0]:
        return math.nan
    return float(values[-1] - values[0]) / (values.size - 1)


def sampled_memory(samplers: dict[str, pd.DataFrame], steps_table: pd.DataFrame | None) -> tuple[SampledMemory, ...]:
    """The process's RSS and each GPU's memory over the run, at each epoch's end, and their growth."""
    ends = epoch_ends_s(steps_table)
    found = []
    for sampler, frame in sorted(samplers.items(), key=lambda item: (item[0] != "host", item[0])):
        kind = "host" if sampler == "host" else "gpu" if sampler.startswith("gpu") else None
        if kind is None or TIME_COLUMN not in frame:
            continue
        for column, what in SAMPLED_COLUMNS[kind]:
            if column not in frame or not frame[column].notna().any():
                continue
            samples = frame[[TIME_COLUMN, column]].dropna().sort_values(TIME_COLUMN)
            times, values = samples[TIME_COLUMN].to_numpy(dtype=np.float64), samples[column].to_numpy(dtype=np.float64)
            at_end = [
                float(values[i - 1]) if (i := np.searchsorted(times, end, side="right")) > 0 else math.nan
                for end in ends
            ]
            total, least = math.nan, math.nan
            if kind == "host" and {"mem_used_bytes", "mem_available_bytes"} <= set(frame.columns):
                machine = (frame["mem_used_bytes"] + frame["mem_available_bytes"]).dropna()
                total = float(machine.max()) if not machine.empty else math.nan
                least = float(frame["mem_available_bytes"].min())
            elif kind == "gpu" and "mem_total_bytes" in frame:
                total = float(frame["mem_total_bytes"].max())
            found.append(
                SampledMemory(
                    sampler,
                    what,
                    column,
                    float(values[0]),
                    float(values[-1]),
                    float(values.max()),
                    total,
                    least,
                    tuple(at_end),
                    epoch_growth(at_end),
                )
            )
            break
    return tuple(found)


def run_batch_size(run: RunRecord | None, steps_table: pd.DataFrame | None = None) -> float:
    """This worker's batch size from run.json, else the images per training step steps.csv recorded
    (`session.step(images=N)`) where every step says the same (NaN: neither states it)."""
    batch = (run.raw.get("per_worker_batch_size") or run.config.get("batch_size")) if run is not None else None
    if isinstance(batch, (int, float)) and not isinstance(batch, bool) and batch > 0:
        return float(batch)
    if steps_table is None or not {"images", "steps"} <= set(steps_table.columns) or steps_table.empty:
        return math.nan
    per_step = (
        pd.to_numeric(steps_table["images"], errors="coerce")
        / pd.to_numeric(steps_table["steps"], errors="coerce").clip(lower=1)
    ).dropna()
    return (
        float(per_step.iat[0]) if not per_step.empty and per_step.nunique() == 1 and per_step.iat[0] > 0 else math.nan
    )


# The trace covers a failure up to this long after its last event: the error is timed when the run
# records it, a little after the allocation failed, and the window stops after that.
OOM_COVER_SLACK_NS = 1_000_000_000


def run_oom(run: RunRecord | None) -> dict | None:
    """run.json's `oom` where a failed run has one (profiler/record/oom.py writes it)."""
    if run is None or run.status != "failed" or not isinstance(run.raw.get("oom"), dict):
        return None
    return run.raw["oom"]


def _typed(value, kind):
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _held_in_trace(events: pd.DataFrame, at_ns: int, allocator: str | None) -> dict | None:
    """The named allocator's (else the fullest one's) state at its last event at or before `at_ns`."""
    best = None
    for name, mine in events[events["start_ns"] <= at_ns].groupby("allocator", sort=True):
        mine = mine.reset_index(drop=True)
        known = mine["bytes_in_use"].notna().to_numpy()
        if not known.any():
            continue
        at = int(np.flatnonzero(known)[-1])
        in_use = float(mine["bytes_in_use"].iat[at])
        if name == allocator or (best is None or (best["name"] != allocator and in_use > best["in_use"])):
            best = {"name": str(name), "events": mine, "at": at, "in_use": in_use}
        if name == allocator:
            break
    if best is None:
        return None
    mine, at, in_use = best["events"], best["at"], best["in_use"]
    live = live_at(mine, len(mine) - 1)
    top, _, _ = _grouped(live, max(in_use - float(live["allocation_bytes"].sum()), 0.0))
    available = float(mine["bytes_available"].iat[at])
    return {
        "held_allocator": best["name"],
        "held_bytes": in_use,
        "capacity_bytes": in_use + available if available == available else math.nan,
        "before_failure_ms": (at_ns - int(mine["start_ns"].iat[len(mine) - 1])) / NS_PER_MS,
        "top": top,
    }


def _held_in_samplers(samplers: dict[str, pd.DataFrame], time_s: float) -> tuple:
    """Each sampler's memory at its last sample before `time_s` (its last sample where not timed)."""
    found = []
    for sampler, frame in sorted(samplers.items(), key=lambda item: (item[0] != "host", item[0])):
        kind = "host" if sampler == "host" else "gpu" if sampler.startswith("gpu") else None
        if kind is None or TIME_COLUMN not in frame:
            continue
        before = frame[frame[TIME_COLUMN] <= time_s] if time_s == time_s else frame
        for column, what in SAMPLED_COLUMNS[kind]:
            if column not in before or not before[column].notna().any():
                continue
            last = float(before.sort_values(TIME_COLUMN)[column].dropna().iat[-1])
            total = math.nan
            if kind == "gpu" and "mem_total_bytes" in frame and frame["mem_total_bytes"].notna().any():
                total = float(frame["mem_total_bytes"].max())
            elif kind == "host" and {"mem_used_bytes", "mem_available_bytes"} <= set(frame.columns):
                machine = (frame["mem_used_bytes"] + frame["mem_available_bytes"]).dropna()
                total = float(machine.max()) if not machine.empty else math.nan
            found.append((sampler, what, last, total))
            break
    return tuple(found)


def oom_at_failure(
    oom: dict, events: pd.DataFrame | None, window: tuple[int, int] | None, samplers: dict[str, pd.DataFrame]
) -> OomAtFailure:
    """What held the memory when the run ran out of it: from the trace where its window covered the
    failure's time, else from the samplers."""
    size = _typed(oom.get("bytes"), int)
    shape = oom.get("shape")
    shape = tuple(shape) if isinstance(shape, list) and all(_typed(d, int) is not None for d in shape) else None
    text = {key: _typed(oom.get(key), str) for key in ("dtype", "op", "allocator", "device")}
    time_s = _typed(oom.get("time_s"), (int, float))
    time_s = float(time_s) if time_s is not None else math.nan
    made = dict(bytes=size, shape=shape, **text, time_s=time_s)
    if events is not None and not events.empty and window is not None and time_s == time_s:
        at_ns = int(time_s * 1e9)
        if window[0] <= at_ns <= window[1] + OOM_COVER_SLACK_NS:
            held = _held_in_trace(events, at_ns, text["allocator"])
            if held is not None:
                return OomAtFailure(**made, source="trace", **held)
    sampled = _held_in_samplers(samplers, time_s)
    return OomAtFailure(**made, source="samplers" if sampled else "none", sampled=sampled)


def memory_report(inputs: RunInputs, steps: pd.DataFrame) -> MemoryReport | None:
    """The memory of one worker's files: its trace's allocators over `steps`, its samplers over the run,
    the out-of-memory error that ended it; None where none of them recorded any."""
    view = inputs.trace
    events = view.memory if view is not None else None
    sampled = sampled_memory(inputs.samplers, inputs.steps_table)
    oom = run_oom(inputs.run)
    if (events is None or events.empty) and not sampled and oom is None:
        return None
    batch = run_batch_size(inputs.run, inputs.steps_table)
    failure = (
        oom_at_failure(oom, events, view.window if view is not None else None, inputs.samplers)
        if oom is not None
        else None
    )
    if events is None or events.empty:
        empty = pd.DataFrame(columns=TIMELINE_COLUMNS)
        return MemoryReport((), empty, pd.DataFrame(columns=STEP_COLUMNS), sampled, batch, failure)
    assert view is not None
    steps = (
        steps[["step", "start_ns", "end_ns"]]
        if not steps.empty
        else pd.DataFrame(columns=["step", "start_ns", "end_ns"])
    )
    peaks, table, per_step = allocator_report(events, steps, view.window[0], batch, inputs.samplers, inputs.run)
    return MemoryReport(peaks, table, per_step, sampled, batch, failure)
