"""What holds an allocator's peak and how much larger a batch would fit: the op whose live tensors
hold the most of it and what kind of memory they are (batch-sized, a workspace, fixed), and the
peak's bytes split into those that grow with the batch and those that do not. Pure functions of the
allocations live at the peak; `memory_allocators.py` finds them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

# What holds most of a peak, by its live tensors (`Holder.kind`): the advice differs for each.
WORKSPACE, BATCH_SIZED, FIXED, OP_TYPE, UNSCALED = "workspace", "batch", "fixed", "op_type", "tensor"


@dataclass(frozen=True)
class Holder:
    """The op whose tensors hold the most of a peak, and what kind of memory they are."""

    op: str
    bytes: int
    kind: str  # WORKSPACE, BATCH_SIZED, FIXED, OP_TYPE or UNSCALED (the batch is unknown)
    tensors: tuple[str, ...]  # its largest live tensors, "shape dtype (region)"
    count: int  # its allocations live at the peak
    steps_made: int = 0  # the traced steps in which the op allocated
    steps: int = 0  # the traced steps

    @property
    def made_every_step(self) -> bool:
        return self.steps >= 2 and self.steps_made == self.steps

    def as_dict(self) -> dict:
        return {
            "op": self.op,
            "bytes": self.bytes,
            "kind": self.kind,
            "tensors": list(self.tensors),
            "count": self.count,
            "steps_made": self.steps_made,
            "steps": self.steps,
        }


def first_dimension(shape: str) -> float:
    """The first dimension of a shape as TensorFlow writes it ("[32,64,53,54]"); NaN for a scalar or none."""
    found = re.match(r"^\[\s*(\d+)", shape or "")
    return float(found.group(1)) if found else math.nan


# What `max_batch` is measured against: the allocator's own capacity (a device's memory), or, for the host's
# allocators, whose capacity is the whole machine's memory shared with every other process, the memory the
# machine had available at its least while the run ran.
ALLOCATOR_CAPACITY, AVAILABLE_MEMORY = "allocator_capacity", "available_memory"
HEADROOM_BASES = (ALLOCATOR_CAPACITY, AVAILABLE_MEMORY)


@dataclass(frozen=True)
class HostRoom:
    """What the host sampler saw of the machine's memory while the run ran."""

    available_bytes: float  # the machine's least available memory (NaN: not sampled)
    rss_peak_bytes: float  # the training process's RSS at its peak (NaN: not sampled)

    @classmethod
    def of(cls, samplers: dict[str, pd.DataFrame]) -> HostRoom:
        frame = samplers.get("host")
        least = peak = math.nan
        if frame is not None and "mem_available_bytes" in frame and frame["mem_available_bytes"].notna().any():
            least = float(frame["mem_available_bytes"].min())
        if frame is not None and "proc_rss_bytes" in frame and frame["proc_rss_bytes"].notna().any():
            peak = float(frame["proc_rss_bytes"].max())
        return cls(least, peak)


def headroom(
    live: pd.DataFrame,
    peak: float,
    capacity: float,
    fragmentation: float,
    batch_size: float,
    host: HostRoom | None = None,
) -> tuple[float, float, float, str, str | None]:
    """(batch bytes, fixed bytes, the largest batch that fits, how, its basis: HEADROOM_BASES, None where
    unknown). The batch part is the live allocations whose first dimension is the batch size; the rest
    (bytes from before the window included) does not grow with it. On a device, the batch that fits:
    fixed + batch bytes x (N / batch) within the capacity less the share of its free bytes that today's
    fragmentation leaves in pieces. On the host (`host` given), the batch bytes may grow into the memory
    the machine had available at its least, never into the whole RAM."""
    if not batch_size > 0:
        return (
            math.nan,
            math.nan,
            math.nan,
            (
                "unknown: the batch size is not known (no run.json states it, and "
                "steps.csv's images per step are not one number)"
            ),
            None,
        )
    scaled = live["shape"].map(first_dimension).to_numpy() == batch_size
    batch_bytes = float(live.loc[scaled, "allocation_bytes"].sum())
    fixed = peak - batch_bytes
    batch = f"{batch_size:.0f}"
    if batch_bytes <= 0:
        return (
            batch_bytes,
            fixed,
            math.nan,
            (f"unknown: no tensor live at the peak has the batch ({batch}) as its first dimension"),
            None,
        )
    grows = (
        f"{_gib(batch_bytes)} of the {_gib(peak)} peak are tensors whose first dimension is the batch ({batch}) "
        f"and grow with it, {_gib(fixed)} do not"
    )
    if host is not None:
        if not host.available_bytes == host.available_bytes:
            return (
                batch_bytes,
                fixed,
                math.nan,
                (
                    "unknown: this allocator draws on the machine's memory, shared with every other process, and no host "
                    "sampler recorded how much of it was available (run with the samplers on)"
                ),
                None,
            )
        fits = math.floor(batch_size * (batch_bytes + host.available_bytes) / batch_bytes)
        rss = (
            f"; the process's RSS peaked at {_gib(host.rss_peak_bytes)}, {host.rss_peak_bytes / peak:.1f}x this "
            "allocator's peak"
            if host.rss_peak_bytes > 0 and peak > 0
            else ""
        )
        return (
            batch_bytes,
            fixed,
            float(max(fits, 0)),
            (
                f"{grows}; the machine had {_gib(host.available_bytes)} available at its least while the run ran (host.csv "
                f"mem_available_bytes), the room a larger batch can take{rss}"
            ),
            AVAILABLE_MEMORY,
        )
    if not capacity > 0:
        return batch_bytes, fixed, math.nan, "unknown: the allocator states no capacity", None
    frag = fragmentation if fragmentation == fragmentation else 0.0
    usable = peak + max(capacity - peak, 0.0) * (1.0 - frag)
    fits = math.floor(batch_size * (usable - fixed) / batch_bytes)
    return (
        batch_bytes,
        fixed,
        float(max(fits, 0)),
        (f"{grows}; {_gib(usable)} of the {_gib(capacity)} capacity is usable at {100 * frag:.1f} % fragmentation"),
        ALLOCATOR_CAPACITY,
    )


def _rank(shape: str) -> int:
    """Dimensions of a shape as TensorFlow writes it ("[32,64,53,54]": 4; "[]": 0); -1 where not stated."""
    inner = (shape or "").strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        return -1
    inner = inner[1:-1].strip()
    return inner.count(",") + 1 if inner else 0


OP_TYPE_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")  # `Conv2D`, `MatMul`: an eager op's name is its type
FLAT_DTYPES = ("uint8", "int8")  # a workspace is raw bytes


def holder_kind(op: str, tensors: pd.DataFrame, batch_size: float) -> str:
    """What an op's tensors live at a peak are, by most of their bytes: batch-sized (first dimension the
    batch), a workspace (temporary flat bytes: a convolution algorithm's scratch), every op of a type
    lumped together (an eager op's name is its type, one name for several layers' tensors of several
    shapes), else of fixed size; `UNSCALED` where the batch is unknown and nothing else tells."""
    weights = tensors["allocation_bytes"].to_numpy(dtype=np.float64)
    total = float(weights.sum())

    def most(mask) -> bool:
        return total > 0 and float(weights[np.asarray(mask, dtype=bool)].sum()) >= 0.5 * total

    shapes = tensors["shape"].astype(str)
    if batch_size > 0 and most(shapes.map(first_dimension).to_numpy() == batch_size):
        return BATCH_SIZED
    ranks = shapes.map(_rank).to_numpy()
    if most((tensors["region"].to_numpy() == "temp") & ((ranks <= 1) | tensors["dtype"].isin(FLAT_DTYPES).to_numpy())):
        return WORKSPACE
    if OP_TYPE_NAME.match(op) and shapes[ranks >= 0].nunique() > 1:
        return OP_TYPE
    return FIXED if batch_size > 0 else UNSCALED


HOLDER_TENSORS = 3  # of the holder's live tensors named, the largest first


def holder_of(live: pd.DataFrame, batch_size: float) -> Holder | None:
    """The op whose live tensors hold the most of a peak (ties: the first allocated), and of what kind."""
    named = live[live["op"] != ""]
    if named.empty:
        return None
    by_op = named.groupby("op", sort=False)["allocation_bytes"].sum().sort_values(ascending=False, kind="stable")
    op = str(by_op.index[0])
    mine = named[named["op"] == op].sort_values("allocation_bytes", ascending=False, kind="stable")
    tensors = tuple(
        dict.fromkeys(
            " ".join(part for part in (str(row.shape), str(row.dtype)) if part) + f" ({row.region or 'unknown'})"
            for row in mine.itertuples(index=False)
        )
    )
    return Holder(op, int(by_op.iat[0]), holder_kind(op, mine, batch_size), tensors[:HOLDER_TENSORS], len(mine))


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"
