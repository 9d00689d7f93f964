"""Whether a setting made training faster: short trials of the baseline and the candidate, alternated.

Each trial is one short run; its step time is the median of its steady steps (warm-up left out), so
a slow step inside one trial moves nothing. The trials are the samples: two sides of a few trials
each, compared by rank (Mann-Whitney's exact one-sided test: with 3 trials a side, every candidate
trial faster than every baseline trial is p = 0.05), and the saving must also exceed the noise, the
larger spread of either side's own trials. A busy machine spreads the trials and mixes their ranks:
the answer is then "not sure", never a wrong "faster".
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

FASTER, SLOWER, NOT_SURE = "faster", "slower", "not sure"
RESULTS = (FASTER, SLOWER, NOT_SURE)
ALPHA = 0.05  # the rank test's one-sided level: the chance of a "faster" where nothing changed
MIN_TRIALS = 3  # a side: fewer cannot reach ALPHA by rank


@dataclass(frozen=True)
class TrialComparison:
    """Two sides' trials compared. Step times in ms; `measured_ms` is the saving (baseline minus
    candidate: positive is faster), `noise_ms` the larger spread of either side's trials."""

    baseline_ms: float
    candidate_ms: float
    measured_ms: float
    noise_ms: float
    p_faster: float
    p_slower: float
    result: str
    why: str


def compare_trials(baseline: Sequence[float], candidate: Sequence[float], alpha: float = ALPHA) -> TrialComparison:
    """The candidate's trials (each one trial's median step time, ms) against the baseline's."""
    base = [float(value) for value in baseline if math.isfinite(value)]
    cand = [float(value) for value in candidate if math.isfinite(value)]
    if len(base) < MIN_TRIALS or len(cand) < MIN_TRIALS:
        middle = (statistics.median(base) if base else math.nan, statistics.median(cand) if cand else math.nan)
        return TrialComparison(
            *middle,
            middle[0] - middle[1],
            math.nan,
            math.nan,
            math.nan,
            NOT_SURE,
            f"{min(len(base), len(cand))} trials on a side; {MIN_TRIALS} are needed to tell",
        )
    base_ms, cand_ms = statistics.median(base), statistics.median(cand)
    measured = base_ms - cand_ms
    noise = max(max(base) - min(base), max(cand) - min(cand))
    p_faster, p_slower = rank_p_below(cand, base), rank_p_below(base, cand)
    trials = f"{len(cand)} trials against {len(base)}"
    if p_faster <= alpha and measured > noise:
        result, why = (
            FASTER,
            f"{trials}: {measured:.2f} ms faster, beyond the trials' noise ({noise:.2f} ms; "
            f"rank test p = {p_faster:.3f})",
        )
    elif p_slower <= alpha and -measured > noise:
        result, why = (
            SLOWER,
            f"{trials}: {-measured:.2f} ms slower, beyond the trials' noise ({noise:.2f} ms; "
            f"rank test p = {p_slower:.3f})",
        )
    else:
        p = min(p_faster, p_slower)
        result, why = (
            NOT_SURE,
            f"{trials}: {measured:+.2f} ms within the trials' noise ({noise:.2f} ms; rank test p = {p:.3f})",
        )
    return TrialComparison(base_ms, cand_ms, measured, noise, p_faster, p_slower, result, why)


def rank_p_below(lower: Sequence[float], upper: Sequence[float]) -> float:
    """Mann-Whitney's exact one-sided p-value that `lower`'s values lie below `upper`'s: the chance, with
    no difference, of a U this small or smaller (a tie counts half, and a half is rounded up: a tie never
    makes the answer surer). Exact with ties by enumerating the sides' assignments where they are few (a
    tune's trials), else from the U distribution without ties."""
    n, m = len(lower), len(upper)
    observed = math.ceil(_u(lower, upper) - 1e-9)
    if math.comb(n + m, n) > MAX_ASSIGNMENTS:
        counts = _u_counts(n, m)
        return sum(count for value, count in enumerate(counts) if value <= observed) / sum(counts)
    pooled = [*lower, *upper]
    every = range(n + m)
    as_small = total = 0
    for chosen in itertools.combinations(every, n):
        mine = set(chosen)
        total += 1
        as_small += _u([pooled[i] for i in chosen], [pooled[i] for i in every if i not in mine]) <= observed
    return as_small / total


MAX_ASSIGNMENTS = 20_000  # 8 trials a side: 12,870


def _u(lower: Sequence[float], upper: Sequence[float]) -> float:
    """Pairs where `lower`'s value is above `upper`'s, a tie counting half: small when `lower` is below."""
    return sum((a > b) + 0.5 * (a == b) for a in lower for b in upper)


@lru_cache(maxsize=None)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many orderings of n and m values give each U (0 .. n*m), by the usual recursion."""
    if n == 0 or m == 0:
        return (1,)
    with_n = _u_counts(n - 1, m)  # the largest value is one of the n: it is above all m
    with_m = _u_counts(n, m - 1)
    size = n * m + 1
    counts = [0] * size
    for value, count in enumerate(with_n):
        counts[value + m] += count
    for value, count in enumerate(with_m):
        counts[value] += count
    return tuple(counts)
