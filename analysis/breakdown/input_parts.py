"""Input split by its cause: the host waiting for the iterator, and the batch's copy to the device.

A step's input (`input_ms`) is host time blocked on the iterator plus host-to-device copies
that no kernel hides. The two have different cures: a wait is the tf.data pipeline's (prefetch,
parallel map, cache); an exposed copy is the transfer's (prefetch to the device, fewer bytes,
pinned memory). Where both happen at once the copy is the cause (the host waits because the
batch is still on its way), so

    input_copy_ms = host-to-device copies that no kernel overlaps, inside the step
    input_wait_ms = input_ms - input_copy_ms

and the two add up to `input_ms` exactly (integer nanoseconds). Without a trace (`steps.csv`),
input is the loop's call of its iterator, so all of it is wait.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.read.view import NS_PER_MS, TraceView, intervals
from analysis.steps.sources import StepSource

PARTS = ("input_wait_ms", "input_copy_ms")


def exposed_copies(view: TraceView) -> iv.Intervals:
    """Host-to-device input copies that no kernel overlaps (empty on a CPU-only trace)."""
    copies = intervals(view.input_copies)
    if view.device.empty:
        return copies
    return iv.subtract(copies, view.device_parts["compute"])


def with_input_parts(view: TraceView | None, steps: pd.DataFrame) -> pd.DataFrame:
    """`steps` with `input_wait_ms` and `input_copy_ms` added after `input_ms` (see the module)."""
    if "input_ms" not in steps:
        return steps
    input_ns = np.rint(steps["input_ms"].to_numpy(dtype=float) * NS_PER_MS).astype(np.int64)
    copy_ns = np.zeros(len(steps), dtype=np.int64)
    if view is not None and len(steps) and not view.input_copies.empty:
        starts = steps["start_ns"].to_numpy(dtype=np.int64)
        ends = steps["end_ns"].to_numpy(dtype=np.int64)
        copy_ns = np.minimum(iv.overlap(exposed_copies(view), starts, ends), input_ns)
    wait_ns = input_ns - copy_ns
    out = steps.copy()
    at = list(out.columns).index("input_ms") + 1
    out.insert(at, "input_wait_ms", wait_ns / NS_PER_MS)
    out.insert(at + 1, "input_copy_ms", copy_ns / NS_PER_MS)
    return out


def split_input(view: TraceView | None, source: StepSource) -> StepSource:
    """`source` with its steps' input split (`with_input_parts`)."""
    return dataclasses.replace(source, steps=with_input_parts(view, source.steps))


def mean_input_parts(steady: pd.DataFrame) -> dict[str, float]:
    """Mean `input_wait_ms` and `input_copy_ms` over the steps a mean breakdown is taken of."""
    return {part: float(steady[part].mean()) if part in steady and len(steady) else 0.0 for part in PARTS}
