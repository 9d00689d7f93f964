"""Several hosts in one profile session: one row per worker, and the straggler with its cause.

In a synchronous job every worker's step lasts as long as the slowest one's: the others
wait for it in the collective. So the straggler is not the worker with the longest step
but the one whose step *minus its collective wait* stands out: more than
`STRAGGLER_EXCESS` above the median of the others. Its cause is the part (input,
compute, host) with the largest excess over the others' median; the rest are waiting.
"""

from __future__ import annotations

import pandas as pd

STRAGGLER_EXCESS = 0.10
WORKER_KEYS = ["worker", "host", "step_ms", "input_ms", "compute_ms", "host_ms", "collective_ms"]
CAUSES = ("input", "compute", "host")


def worker_row(worker: str | int, host: str, mean: dict) -> dict:
    row = {"worker": worker, "host": host}
    row.update({key: float(mean.get(key, 0.0)) for key in WORKER_KEYS[2:]})
    return row


def find_straggler(rows: list[dict]) -> dict | None:
    """`{"worker", "cause", "evidence"}` for the worker that holds the others back, or None."""
    if len(rows) < 2:
        return None
    frame = pd.DataFrame(rows)
    own = frame["step_ms"] - frame["collective_ms"]
    best, best_excess = None, 0.0
    for i in frame.index:
        others = own.drop(i)
        median = float(others.median())
        excess = float(own[i]) / median - 1.0 if median > 0 else 0.0
        if excess > STRAGGLER_EXCESS and excess > best_excess:
            best, best_excess = i, excess
    if best is None:
        return None
    others = frame.drop(best)
    excess_by_part = {part: float(frame.at[best, f"{part}_ms"] - others[f"{part}_ms"].median()) for part in CAUSES}
    cause = max(excess_by_part, key=excess_by_part.get)
    name = frame.at[best, "worker"]
    waiting = ", ".join(f"{r['worker']} ({r['collective_ms']:.1f} ms)" for _, r in others.iterrows())
    evidence = (f"{name}'s step without collective wait is {own[best]:.1f} ms, {100 * best_excess:.0f} % above the "
                f"others' median ({float(own.drop(best).median()):.1f} ms); its {cause} is "
                f"{frame.at[best, f'{cause}_ms']:.1f} ms vs a median {others[f'{cause}_ms'].median():.1f} ms. "
                f"The others wait for it in the collective: {waiting}")
    return {"worker": rows[best]["worker"], "cause": cause, "evidence": evidence}
