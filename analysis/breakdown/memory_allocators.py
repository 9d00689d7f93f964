"""Each allocator's peak in the traced window from its events: what was live at it, each step's peak and held bytes."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.breakdown.memory_holders import Holder, HostRoom, headroom, holder_of
from analysis.read.run_files import RunRecord

NS_PER_MS = 1e6
TOP_AT_PEAK = 10  # groups of live allocations shown at the peak (JSON, HTML); the largest first
BEFORE_WINDOW = "before the window"  # the region of the bytes in use that no allocation of the window explains
# The allocator's reserved bytes (`bytes_reserved`: PJRT's stack, XLA's scratch) at the peak: they move without
# allocation events of their own, so they are neither an op's nor from before the window (XProf's "stack").
RESERVED = "reserved"
# Steps whose end holds more than the step before, one after another: a leak candidate once the
# growth reaches this many bytes per step (a scalar kept from every step is 256 bytes in a BFC allocator).
MIN_GROWTH_BYTES_PER_STEP = 1024.0
# Step ends (after the first) needed to tell a leak from memory that levels off (caches and pools filling
# over the first few calls: 434, 434, 500, 500, 502 MiB is a plateau, seen whole over 14 calls).
MIN_GROWTH_STEPS = 8
PLATEAU_SHARE = 0.5  # the later half of the ends growing at under half the earlier half's rate: levelling off
GPU_ALLOCATOR = re.compile(r"^GPU_(\d+)_bfc$")
HOST_ALLOCATORS = ("mklcpu", "cpu", "cpu_bfc")  # the host memory's own allocators (not gpu_host_bfc's pinned pool)
TIMELINE_COLUMNS = [
    "allocator",
    "time_ms",
    "step",
    "activity",
    "bytes_in_use",
    "bytes",
    "requested_bytes",
    "op",
    "region",
    "dtype",
    "shape",
    "fragmentation",
    "bytes_available",
]
STEP_COLUMNS = ["allocator", "step", "start_ms", "end_ms", "peak_bytes", "end_bytes"]


@dataclass(frozen=True)
class Live:
    """Allocations live at an allocator's peak with the same op, shape, dtype and region."""

    op: str | None  # None: allocated before the window, by ops the trace does not name
    shape: str | None
    dtype: str | None
    region: str
    bytes: int
    count: int | None  # None: unknown (before the window)

    def as_dict(self) -> dict:
        return {
            "op": self.op,
            "shape": self.shape,
            "dtype": self.dtype,
            "region": self.region,
            "bytes": self.bytes,
            "count": self.count,
        }

    @property
    def in_window(self) -> bool:
        """Whether these are allocations of the window (not bytes from before it, nor reserved)."""
        return self.region not in (BEFORE_WINDOW, RESERVED)

    @property
    def unnamed(self) -> str:
        """What bytes of no op are, in words."""
        if self.region == RESERVED:
            return "reserved by the allocator (stack and scratch, with no allocation events of their own)"
        return "allocated before the traced window" if self.region == BEFORE_WINDOW else "no op named"


@dataclass(frozen=True)
class AllocatorPeak:
    """One allocator in the traced window: its peak, what held it, its steps and the batch headroom."""

    name: str
    peak_bytes: int
    peak_time_ms: float  # from the window's start
    peak_step: int | None  # the step the peak fell in (None: between steps)
    peak_op: str | None  # the op allocating when the peak was reached (None: not named)
    capacity_bytes: float  # NaN: not stated
    capacity_source: str
    fragmentation: float  # at the peak (the allocator's own figure: 1 - largest free chunk / free bytes)
    batch_bytes: float  # of the peak: tensors whose first dimension is the batch (NaN: batch unknown)
    fixed_bytes: float  # the rest of the peak
    max_batch: float  # the largest batch that fits the capacity at today's fragmentation (NaN: unknown)
    headroom: str  # how max_batch was made, or why it is unknown
    headroom_basis: str | None  # what max_batch was measured against (HEADROOM_BASES), None: unknown
    top_at_peak: tuple[Live, ...]  # the largest groups live at the peak, `before the window` among them
    by_op: tuple[tuple[str, int], ...]  # bytes live at the peak per op named, the largest first
    by_region: tuple[tuple[str, int], ...]  # per region (TensorFlow's region_type; `before the window`)
    events: int
    growth_bytes_per_step: float  # bytes held at step end, growing step after step (NaN: not growing or unknown)
    lifetime_peak_bytes: float = math.nan  # the allocator's own peak since it started (`peak_bytes_in_use`)
    growth_steps: int = 0  # the step ends the growth was judged over
    reserved_bytes: float = 0.0  # of the peak: the allocator's reserved bytes (`RESERVED`)
    holder: Holder | None = None  # the op whose tensors hold the most of the peak

    @property
    def lifetime_above_window(self) -> bool:
        """Whether the allocator had held more before the window than at the window's peak."""
        return self.lifetime_peak_bytes > self.peak_bytes

    @property
    def capacity_share(self) -> float:
        return self.peak_bytes / self.capacity_bytes if self.capacity_bytes > 0 else math.nan

    def as_dict(self, steps: pd.DataFrame) -> dict:
        mine = steps[steps["allocator"] == self.name]
        return {
            "name": self.name,
            "peak_bytes": self.peak_bytes,
            "peak_step": self.peak_step,
            "peak_op": self.peak_op,
            "capacity_bytes": _int_or_none(self.capacity_bytes),
            "fragmentation": _float_or_none(self.fragmentation),
            "batch_bytes": _int_or_none(self.batch_bytes),
            "fixed_bytes": _int_or_none(self.fixed_bytes),
            "max_batch": _int_or_none(self.max_batch),
            "top_at_peak": [live.as_dict() for live in self.top_at_peak],
            "peak_time_ms": self.peak_time_ms,
            "capacity_source": self.capacity_source,
            "headroom": self.headroom,
            "headroom_basis": self.headroom_basis,
            "headroom_reason": self.headroom if self.headroom_basis is None else None,
            "lifetime_peak_bytes": _int_or_none(self.lifetime_peak_bytes),
            "holder": self.holder.as_dict() if self.holder is not None else None,
            "by_region": dict(self.by_region),
            "events": self.events,
            "growth_bytes_per_step": _float_or_none(self.growth_bytes_per_step),
            "growth_steps": self.growth_steps,
            "steps": [
                {"step": int(s), "peak_bytes": _int_or_none(p), "end_bytes": _int_or_none(e)}
                for s, p, e in zip(mine["step"], mine["peak_bytes"], mine["end_bytes"])
            ],
        }


def _int_or_none(value) -> int | None:
    return int(value) if value is not None and value == value and math.isfinite(value) else None


def _float_or_none(value) -> float | None:
    return float(value) if value is not None and value == value else None


def step_of(times_ns: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step each time falls in ([start, end)), NaN between steps."""
    if steps.empty:
        return np.full(times_ns.size, np.nan)
    ordered = steps.sort_values("start_ns", kind="stable")
    starts = ordered["start_ns"].to_numpy(dtype=np.int64)
    ends = ordered["end_ns"].to_numpy(dtype=np.int64)
    index = np.searchsorted(starts, times_ns, side="right") - 1
    inside = (index >= 0) & (times_ns < ends[np.clip(index, 0, None)])
    numbers = ordered["step"].to_numpy(dtype=np.float64)[np.clip(index, 0, None)]
    return np.where(inside, numbers, np.nan)


def next_at_same_address(address: np.ndarray) -> np.ndarray:
    """For each event (in time order), the position of the next event at the same address (n: none);
    an event without an address has none."""
    n = address.size
    position = np.arange(n)
    order = np.lexsort((position, address))
    following = np.full(n, n)
    same = address[order][1:] == address[order][:-1]  # NaN never equals: no address, never matched
    following[order[:-1][same]] = order[1:][same]
    return following


def live_at(events: pd.DataFrame, at: int) -> pd.DataFrame:
    """The allocations of `events` (one allocator, time order) made at or before position `at` and not
    freed by then: the next event at their address comes after it."""
    following = next_at_same_address(events["address"].to_numpy(dtype=np.float64))
    position = np.arange(len(events))
    alive = events["allocation"].to_numpy(dtype=bool) & (position <= at) & (following > at)
    return events[alive]


def _with_steps(holder: Holder | None, events: pd.DataFrame, steps: pd.DataFrame) -> Holder | None:
    """The holder with the traced steps it allocated in (a tensor made in every step or once)."""
    if holder is None or steps.empty:
        return holder
    mine = events[events["allocation"].to_numpy(dtype=bool) & (events["op"] == holder.op).to_numpy()]
    made = step_of(mine["start_ns"].to_numpy(dtype=np.int64), steps)
    return dataclasses.replace(holder, steps_made=int(np.unique(made[~np.isnan(made)]).size), steps=len(steps))


def _grouped(live: pd.DataFrame, before: float, reserved: float = 0.0) -> tuple[tuple[Live, ...], tuple, tuple]:
    """The live allocations grouped by op, shape, dtype and region, by op, and by region; the bytes from
    before the window and the allocator's reserved bytes, each a group of no op."""
    keys = ["op", "shape", "dtype", "region"]
    groups = live.groupby(keys, sort=False, dropna=False)["allocation_bytes"].agg(["sum", "size"]).reset_index()
    rows = [
        Live(
            str(r.op) or None,
            str(r.shape) or None,
            str(r.dtype) or None,
            str(r.region) or "unknown",
            int(r.sum),
            int(r.size),
        )
        for r in groups.itertuples(index=False)
    ]
    if before > 0:
        rows.append(Live(None, None, None, BEFORE_WINDOW, int(before), None))
    if reserved > 0:
        rows.append(Live(None, None, None, RESERVED, int(reserved), None))
    rows.sort(key=lambda live: -live.bytes)
    by_op = (
        live[live["op"] != ""]
        .groupby("op", sort=False)["allocation_bytes"]
        .sum()
        .sort_values(ascending=False, kind="stable")
    )
    regions = (
        live.assign(region=live["region"].replace("", "unknown"))
        .groupby("region", sort=False)["allocation_bytes"]
        .sum()
        .to_dict()
    )
    if before > 0:
        regions[BEFORE_WINDOW] = before
    if reserved > 0:
        regions[RESERVED] = reserved
    by_region = tuple(sorted(((str(k), int(v)) for k, v in regions.items()), key=lambda item: -item[1]))
    return tuple(rows[:TOP_AT_PEAK]), tuple((str(k), int(v)) for k, v in by_op.items()), by_region


def step_table(name: str, events: pd.DataFrame, steps: pd.DataFrame, origin_ns: int) -> pd.DataFrame:
    """Per step: the peak bytes in use in it (what it entered with counts) and the bytes still in use at
    its end; NaN where no event before the step's end says."""
    known = events[events["bytes_in_use"].notna()]
    times = known["start_ns"].to_numpy(dtype=np.int64)
    in_use = np.append(known["bytes_in_use"].to_numpy(dtype=np.float64), np.nan)  # [-1]: before any event
    starts, ends = steps["start_ns"].to_numpy(dtype=np.int64), steps["end_ns"].to_numpy(dtype=np.int64)
    first, last = np.searchsorted(times, starts, side="left"), np.searchsorted(times, ends, side="left")
    entering, end_bytes = in_use[first - 1], in_use[last - 1]  # index -1: NaN, nothing before
    inside = np.full(starts.size, np.nan)
    has = last > first
    if has.any():  # the largest value after an event of each step that has one
        order = np.argsort(first[has], kind="stable")
        bounds = np.column_stack([first[has][order], last[has][order]]).ravel()
        # reduceat over [first, last) of each step (the segments between steps are skipped); the NaN
        # appended at the end keeps every bound a valid index
        inside[np.flatnonzero(has)[order]] = np.maximum.reduceat(in_use, bounds)[::2]
    peak = np.fmax(inside, entering)
    return pd.DataFrame(
        {
            "allocator": name,
            "step": steps["step"].to_numpy(dtype=np.int64),
            "start_ms": (starts - origin_ns) / NS_PER_MS,
            "end_ms": (ends - origin_ns) / NS_PER_MS,
            "peak_bytes": peak,
            "end_bytes": end_bytes,
        },
        columns=STEP_COLUMNS,
    )


def growth_per_step(end_bytes: np.ndarray) -> float:
    """Bytes held at step end growing step after step (the first step left out: it may build what the
    others reuse): over `MIN_GROWTH_STEPS` ends or more, each at least the one before, half of them more,
    by `MIN_GROWTH_BYTES_PER_STEP` a step or more, and not levelling off (the later half growing at least
    `PLATEAU_SHARE` as fast as the earlier); NaN otherwise."""
    ends = end_bytes[1:]
    ends = ends[~np.isnan(ends)]
    if ends.size < MIN_GROWTH_STEPS:
        return math.nan
    steps = np.diff(ends)
    per_step = float(ends[-1] - ends[0]) / (ends.size - 1)
    if (steps < 0).any() or (steps > 0).sum() * 2 < steps.size or per_step < MIN_GROWTH_BYTES_PER_STEP:
        return math.nan
    half = ends.size // 2
    earlier = float(ends[half] - ends[0]) / half
    later = float(ends[-1] - ends[half]) / (ends.size - 1 - half)
    return per_step if later >= PLATEAU_SHARE * earlier else math.nan


def growth_steps(end_bytes: np.ndarray) -> int:
    """The step ends `growth_per_step` reads (the first step's left out)."""
    return int((~np.isnan(end_bytes[1:])).sum())


def allocator_peak(
    name: str,
    events: pd.DataFrame,
    steps: pd.DataFrame,
    batch_size: float,
    stated_capacity: tuple[float, str],
    origin_ns: int,
    host: HostRoom | None = None,
) -> tuple[AllocatorPeak, pd.DataFrame] | None:
    """One allocator's peak and steps from its events in time order; None where no event states its bytes.
    `host`: the machine's memory as sampled, for an allocator of the host's own memory."""
    events = events.reset_index(drop=True)
    in_use = events["bytes_in_use"].to_numpy(dtype=np.float64)
    if not (~np.isnan(in_use)).any():
        return None
    at = int(np.nanargmax(in_use))  # the first time the peak is reached
    peak = float(in_use[at])
    live = live_at(events, at)
    reserved = float(np.nan_to_num(events["bytes_reserved"].iat[at])) if "bytes_reserved" in events else 0.0
    before = max(peak - reserved - float(live["allocation_bytes"].sum()), 0.0)
    available = float(events["bytes_available"].iat[at])
    # a negative amount free, or a fragmentation outside 0-1, is no allocator's: not stated, never a share
    capacity, source = (
        (peak + available, "the allocator's bytes in use + bytes available at the peak")
        if available >= 0
        else stated_capacity
    )
    if capacity < peak:
        capacity, source = math.nan, ""
    fragmentation = float(events["fragmentation"].iat[at])
    fragmentation = fragmentation if 0.0 <= fragmentation <= 1.0 else math.nan
    batch_bytes, fixed, max_batch, how, basis = headroom(live, peak, capacity, fragmentation, batch_size, host)
    top, by_op, by_region = _grouped(live, before, reserved)
    lifetime = events["peak_bytes_in_use"].max() if "peak_bytes_in_use" in events else math.nan
    at_ns = int(events["start_ns"].iat[at])
    step = step_of(np.array([at_ns]), steps)[0]
    op = str(events["op"].iat[at]) or None
    per_step = step_table(name, events, steps, origin_ns)
    return AllocatorPeak(
        name=name,
        peak_bytes=int(peak),
        peak_time_ms=(at_ns - origin_ns) / NS_PER_MS,
        peak_step=int(step) if step == step else None,
        peak_op=op,
        capacity_bytes=capacity,
        capacity_source=source,
        fragmentation=fragmentation,
        batch_bytes=batch_bytes,
        fixed_bytes=fixed,
        max_batch=max_batch,
        headroom=how,
        headroom_basis=basis,
        top_at_peak=top,
        by_op=by_op,
        by_region=by_region,
        events=len(events),
        growth_bytes_per_step=growth_per_step(per_step["end_bytes"].to_numpy(dtype=np.float64)),
        growth_steps=growth_steps(per_step["end_bytes"].to_numpy(dtype=np.float64)),
        lifetime_peak_bytes=float(lifetime) if lifetime == lifetime else math.nan,
        reserved_bytes=reserved,
        holder=_with_steps(holder_of(live, batch_size), events, steps),
    ), per_step


def timeline(events: pd.DataFrame, steps: pd.DataFrame, origin_ns: int) -> pd.DataFrame:
    """The allocator events as memory.csv has them: times in ms from the window's start, with their step."""
    times = events["start_ns"].to_numpy(dtype=np.int64)
    step = step_of(times, steps)
    return pd.DataFrame(
        {
            "allocator": events["allocator"].to_numpy(),
            "time_ms": (times - origin_ns) / NS_PER_MS,
            "step": pd.arrays.IntegerArray(np.nan_to_num(step).astype(np.int64), np.isnan(step)),
            "activity": np.where(events["allocation"].to_numpy(dtype=bool), "allocation", "deallocation"),
            "bytes_in_use": events["bytes_in_use"].to_numpy(),
            "bytes": events["allocation_bytes"].to_numpy(),
            "requested_bytes": events["requested_bytes"].to_numpy(),
            "op": events["op"].to_numpy(),
            "region": events["region"].to_numpy(),
            "dtype": events["dtype"].to_numpy(),
            "shape": events["shape"].to_numpy(),
            "fragmentation": events["fragmentation"].to_numpy(),
            "bytes_available": events["bytes_available"].to_numpy(),
        },
        columns=TIMELINE_COLUMNS,
    )


def stated_capacity(name: str, samplers: dict[str, pd.DataFrame], run: RunRecord | None) -> tuple[float, str]:
    """An allocator's memory where its events do not state it: for `GPU_<i>_bfc`, the GPU sampler's
    mem_total_bytes, else run.json's `device.gpus[i].memory_bytes`; for the host's allocators, run.json's
    `device.memory_bytes`; NaN where neither says."""
    device = run.device if run is not None else {}
    found = GPU_ALLOCATOR.match(name)
    if found is None:
        if name in HOST_ALLOCATORS and _positive(device.get("memory_bytes")):
            return float(device["memory_bytes"]), "run.json device.memory_bytes"
        return math.nan, ""
    index = int(found.group(1))
    frame = samplers.get(f"gpu{index}")
    if frame is not None and "mem_total_bytes" in frame and frame["mem_total_bytes"].notna().any():
        return float(frame["mem_total_bytes"].max()), f"gpu{index}.csv mem_total_bytes"
    gpus = device.get("gpus") or []
    gpu = gpus[index] if isinstance(gpus, list) and index < len(gpus) and isinstance(gpus[index], dict) else {}
    if _positive(gpu.get("memory_bytes")):
        return float(gpu["memory_bytes"]), f"run.json device.gpus[{index}].memory_bytes"
    return math.nan, ""


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def allocator_report(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    origin_ns: int,
    batch_size: float = math.nan,
    samplers: dict[str, pd.DataFrame] | None = None,
    run: RunRecord | None = None,
) -> tuple[tuple[AllocatorPeak, ...], pd.DataFrame, pd.DataFrame]:
    """Every allocator's peak (the largest peak first), the timeline and the per-step table."""
    peaks, tables = [], []
    room = HostRoom.of(samplers or {})
    for name, mine in events.groupby("allocator", sort=True):
        made = allocator_peak(
            str(name),
            mine,
            steps,
            batch_size,
            stated_capacity(str(name), samplers or {}, run),
            origin_ns,
            room if str(name) in HOST_ALLOCATORS else None,
        )
        if made is not None:
            peaks.append(made[0])
            tables.append(made[1])
    peaks.sort(key=lambda peak: (-peak.peak_bytes, peak.name))
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=STEP_COLUMNS)
    return tuple(peaks), timeline(events, steps, origin_ns), table
