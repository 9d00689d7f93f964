"""The straggler rule: the worker of a synchronous job that the others wait for, with its cause.

In a synchronous job every worker's step lasts as long as the slowest one's: the others
wait for it in the collective. So the straggler is not the worker with the longest step
but the one whose step *minus its collective wait* is above the others' median while they
wait for it, by a part (input, compute, host) whose excess over the others' median is more
than `STRAGGLER_EXCESS` of their step and more than `NOISE_FACTOR` times that part's step-to-step noise (a busy
machine makes compute swing in every worker; injected or real extra work is there in every
step). Its cause is that part, or
`contention` when other processes loaded the machine and the straggler's process got less
CPU than the others: it was slowed, not given more work (for an input straggler, only when its
compute is slow too: a worker waiting for data uses less CPU on any machine). Hosts that share no collective
are independent and have no straggler; too few steps to tell is said, not guessed.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.breakdown.workers import CAUSES
from analysis.rules.finding_rules import CONTENTION_PCT

STRAGGLER_EXCESS = 0.05  # of the others' step without collective wait: a floor under the noise test
NOISE_FACTOR = 3.0  # the part's excess must pass this many standard deviations of that part's per-step times
MIN_STRAGGLER_STEPS = 3  # steady steps each worker needs before one can be told apart
CONTENTION_OTHER_CPU_PCT = CONTENTION_PCT  # other processes' share of the machine that makes timings suspect
CONTENTION_CPU_SHORTFALL = 0.05  # the straggler's CPU at least this far below the others' median
CONTENTION = "contention"
NO_TRACE = (
    "no worker has a profiler trace, and steps.csv does not time the collective wait: the straggler cannot "
    "be told (profile the run)"
)


def find_straggler(frame: pd.DataFrame, other_cpu_pct: float = math.nan) -> tuple[dict | None, str | None]:
    """(`{"worker", "cause", "evidence"}` for the worker that holds the others back, or None;
    why there is none, or None when there is one or only one worker). `frame` has one row per
    worker (`analysis.breakdown.workers.worker_row`); `other_cpu_pct` is what processes outside
    the job took of the machine (% of all cores)."""
    if len(frame) < 2:
        return None, None
    frame = frame.reset_index(drop=True)
    steps_used = frame["steps_used"] if "steps_used" in frame else pd.Series(MIN_STRAGGLER_STEPS, index=frame.index)
    few = frame[steps_used < MIN_STRAGGLER_STEPS]
    if not few.empty:
        named = ", ".join(f"{r['worker']} ({int(steps_used[i])})" for i, r in few.iterrows())
        return None, (
            f"too few steps to tell: steady steps per worker {named}, at least {MIN_STRAGGLER_STEPS} "
            "needed; trace more steps (--profile-steps)"
        )
    if not (frame["collective_ms"] > 0).any():
        return None, (
            "the hosts are independent: none waits in a collective that the others share, so none holds the others back"
        )
    own = frame["step_ms"] - frame["collective_ms"]
    # A straggler holds the others back (they wait longer in the collective than it does, where the
    # noise lets that show), and it stands out by one part (input, compute, host) by more than STRAGGLER_EXCESS of their step
    # and more than NOISE_FACTOR times that part's step-to-step noise (on a busy machine compute
    # swings by tens of ms in every worker, while 40 ms of extra host work is there every step).
    # Every worker and part is weighed, not only the slowest step: load can make another worker's
    # compute the longest while the one the others wait for is slow by its host work.
    candidates, closest = [], None
    for i in frame.index:
        others = frame.drop(i)
        median = float(own.drop(i).median())
        waits = float(others["collective_ms"].median()) > float(frame.at[i, "collective_ms"])
        for part in CAUSES:
            excess = float(frame.at[i, f"{part}_ms"] - others[f"{part}_ms"].median())
            column = f"{part}_noise_ms"
            noise = float(frame[column].median()) if column in frame else math.nan
            noise = 0.0 if not noise == noise else noise
            # Waiting is how a straggler shows, but on a loaded machine the others' compute noise can
            # hide it in the collective times: a part far outside its own noise stands out regardless.
            passes = median > 0 and excess > STRAGGLER_EXCESS * median and excess > NOISE_FACTOR * noise
            if passes:
                candidates.append((waits, excess, i, part, noise, median))
            elif closest is None or excess > closest[0]:
                closest = (excess, i, part, noise, median)
    if not (frame["collective_ms"] > 0).all() and not candidates:
        slow = int(own.idxmax())
        return None, (
            f"the hosts are independent: {frame.at[slow, 'worker']} is slower, but the others do not wait "
            "for it in a collective"
        )
    if not candidates:
        assert closest is not None  # every worker and part was weighed: one came closest
        part_excess, best, part, noise, median = closest
        share = 100.0 * max(part_excess, 0.0) / median if median > 0 else 0.0
        return None, (
            f"no worker stands out: the largest excess, {frame.at[best, 'worker']}'s {part}, is "
            f"{max(part_excess, 0.0):.1f} ms ({share:.0f} % of the others' step without collective wait) "
            f"above the others' median; a straggler needs more than {100 * STRAGGLER_EXCESS:.0f} % and "
            f"more than {NOISE_FACTOR:g} times that part's step-to-step noise ({noise:.1f} ms), and the "
            "others waiting for it"
        )
    _, part_excess, best, part, noise, median = max(candidates)
    others = frame.drop(best)
    excess_own = {best: float(own[best] - median)}
    best_excess = excess_own[best]
    name = frame.at[best, "worker"]
    detail = f"its {part} is {frame.at[best, f'{part}_ms']:.1f} ms vs a median {others[f'{part}_ms'].median():.1f} ms"
    cause = part
    cpu = _process_cpu(frame)
    others_cpu = float(cpu.drop(best).median())
    if _slowed_by_load(frame, best, part, other_cpu_pct):
        cause = CONTENTION
        detail = (
            f"other processes took {other_cpu_pct:.0f} % of the machine's CPU and its process got "
            f"{cpu[best]:.0f} % CPU against the others' {others_cpu:.0f} %: it was slowed by the load, not "
            f"given more work ({detail})"
        )
    waiting = ", ".join(f"{r['worker']} ({r['collective_ms']:.1f} ms)" for _, r in others.iterrows())
    against = (
        f"{100 * best_excess / median:.0f} % above the others' median ({median:.1f} ms)"
        if best_excess > 0
        else f"beside the others' median of {median:.1f} ms"
    )
    evidence = (
        f"{name}'s step without collective wait is {own[best]:.1f} ms, {against}; {detail} (step-to-step noise of its {part} {noise:.1f} ms). "
        f"The others wait for it in the collective: {waiting}"
    )
    return {"worker": frame["worker"].tolist()[best], "cause": cause, "evidence": evidence}, None


def _process_cpu(frame: pd.DataFrame) -> pd.Series:
    return frame["proc_cpu_mean_pct"] if "proc_cpu_mean_pct" in frame else pd.Series(math.nan, index=frame.index)


def _slowed_by_load(frame: pd.DataFrame, i, part: str, other_cpu_pct: float) -> bool:
    """Whether worker `i`, slow by `part`, was slowed by other processes: the machine was loaded and its
    process got less CPU than the others'. A worker waiting for its data uses less CPU on any machine,
    so an input straggler was starved only if the part that needs the CPU, its compute, is slow too."""
    cpu = _process_cpu(frame)
    if not (
        other_cpu_pct >= CONTENTION_OTHER_CPU_PCT
        and cpu[i] < (1 - CONTENTION_CPU_SHORTFALL) * float(cpu.drop(i).median())
    ):
        return False
    if part != "input":
        return True
    others = frame.drop(i)
    median = float((others["step_ms"] - others["collective_ms"]).median())
    compute_excess = float(frame.at[i, "compute_ms"] - others["compute_ms"].median())
    noise = float(frame["compute_noise_ms"].median()) if "compute_noise_ms" in frame else 0.0
    return compute_excess > max(STRAGGLER_EXCESS * median, NOISE_FACTOR * (noise if noise == noise else 0.0))


SLOWEST_SHOWN = 10  # workers a report names by score; JSON and workers.csv hold every worker


def slowest_workers(frame: pd.DataFrame, k: int = SLOWEST_SHOWN, other_cpu_pct: float = math.nan) -> list[dict]:
    """The `k` workers with the highest `straggler_score`, each with the part (input, compute, host)
    that exceeds the other workers' median by the most (`contention` as in `find_straggler`) and by
    how much per step; `cause` is null for a worker no part of which exceeds the others'."""
    if len(frame) < 2 or "straggler_score" not in frame:
        return []
    frame = frame.reset_index(drop=True)
    out = []
    for i in frame["straggler_score"].sort_values(ascending=False, kind="stable").index[:k]:
        others = frame.drop(i)
        excess = {part: float(frame.at[i, f"{part}_ms"] - others[f"{part}_ms"].median()) for part in CAUSES}
        part = max(excess, key=lambda p: excess[p])
        cause: str | None = part if excess[part] > 0 else None
        if cause and _slowed_by_load(frame, i, part, other_cpu_pct):
            cause = CONTENTION
        score = frame.at[i, "straggler_score"]
        out.append(
            {
                "worker": frame["worker"].tolist()[i],
                "straggler_score": None if score != score else float(score),
                "own_step_ms": float(frame.at[i, "step_ms"] - frame.at[i, "collective_ms"]),
                "cause": cause,
                "excess_ms": max(excess[part], 0.0),
            }
        )
    return out
