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


# steps.csv's wait for the loop's own iterator, as a share of its step, from which it is input the trace
# cannot see: below it, the two clocks' disagreement.
ITERATOR_WAIT_MIN_PCT = 5.0


def python_iterator_wait(steps: pd.DataFrame, steps_table: pd.DataFrame | None) -> tuple[pd.DataFrame, str | None]:
    """Where the trace records no input at all (no tf.data iterator: the loop iterates a Python
    generator or numpy batches) but steps.csv timed the loop's wait for its iterator, that wait is
    input, not host overhead: each traced step takes its steps.csv `input_ms` (at most its host time)
    from host into input. The steps, and a note where it did."""
    needed = {"step", "input_ms", "step_ms"}
    if (
        steps_table is None
        or steps.empty
        or not needed <= set(steps_table.columns)
        or "host_ms" not in steps
        or steps["input_ms"].sum() > 0
    ):
        return steps, None
    csv = steps_table.drop_duplicates("step", keep="last").set_index("step")
    waited = steps["step"].map(csv["input_ms"]).astype(float).fillna(0.0).clip(lower=0.0)
    waited = np.minimum(waited.to_numpy(), steps["host_ms"].to_numpy(dtype=float))
    matched = steps["step"].isin(csv.index).to_numpy()
    share = 100.0 * waited[matched].sum() / max(float(steps.loc[matched, "step_ms"].sum()), 1e-9)
    if not matched.any() or share < ITERATOR_WAIT_MIN_PCT:
        return steps, None
    out = steps.copy()
    out["input_ms"] = out["input_ms"] + waited
    out["host_ms"] = out["host_ms"] - waited
    return out, (
        f"the trace records no input pipeline, but the loop waited for its iterator {share:.1f} % of the step "
        "(steps.csv input_ms, a Python generator or numpy batches): that wait is input, taken from host"
    )


def split_input(view: TraceView | None, source: StepSource, steps_table: pd.DataFrame | None = None) -> StepSource:
    """`source` with its steps' input split (`with_input_parts`), the wait for a Python iterator that
    only steps.csv timed counted as input (`python_iterator_wait`)."""
    steps, note = (
        python_iterator_wait(source.steps, steps_table) if source.kind != "steps_csv" else (source.steps, None)
    )
    notes = (*source.notes, note) if note else source.notes
    return dataclasses.replace(
        source, steps=with_input_parts(view, steps), notes=notes, python_iterator=note is not None
    )


def mean_input_parts(steady: pd.DataFrame) -> dict[str, float]:
    """Mean `input_wait_ms` and `input_copy_ms` over the steps a mean breakdown is taken of."""
    return {part: float(steady[part].mean()) if part in steady and len(steady) else 0.0 for part in PARTS}
