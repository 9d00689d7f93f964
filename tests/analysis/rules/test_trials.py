"""Whether a setting made training faster, from alternated trials (`analysis.rules.trials`): exact rank
p-values, the noise, and a busy machine that makes the answer "not sure", never a wrong "faster"."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from analysis.rules import trials


def _brute_p(lower, upper) -> float:
    """The exact one-sided p by enumerating every assignment of the pooled values to the two sides."""
    pooled = [*lower, *upper]
    observed = sum((a > b) + 0.5 * (a == b) for a in lower for b in upper)
    as_small = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(lower)):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        u = sum((pooled[i] > b) + 0.5 * (pooled[i] == b) for i in chosen for b in rest)
        total += 1
        as_small += u <= math.ceil(observed - 1e-9)
    return as_small / total


@pytest.mark.parametrize("seed", range(40))
def test_the_rank_p_value_is_the_exact_one(seed):
    rng = random.Random(seed)
    n, m = rng.randint(1, 6), rng.randint(1, 6)
    lower = [rng.choice([1.0, 2.0, 3.0, rng.random()]) for _ in range(n)]
    upper = [rng.choice([1.0, 2.0, 3.0, rng.random()]) for _ in range(m)]
    assert trials.rank_p_below(lower, upper) == pytest.approx(_brute_p(lower, upper))


def test_three_trials_a_side_all_faster_is_the_test_at_its_level():
    assert trials.rank_p_below([1, 2, 3], [4, 5, 6]) == pytest.approx(1 / 20)
    assert trials.rank_p_below([4, 5, 6], [1, 2, 3]) == pytest.approx(1.0)


def test_a_clear_saving_is_faster_and_its_numbers_are_the_trials():
    result = trials.compare_trials([100.0, 102.0, 101.0], [80.0, 81.0, 79.5])
    assert result.result == trials.FASTER
    assert (result.baseline_ms, result.candidate_ms, result.measured_ms) == (101.0, 80.0, 21.0)
    assert result.noise_ms == pytest.approx(2.0) and result.p_faster == pytest.approx(0.05)
    slower = trials.compare_trials([80.0, 81.0, 79.5], [100.0, 102.0, 101.0])
    assert slower.result == trials.SLOWER and slower.measured_ms == -21.0


def test_a_saving_within_the_noise_or_with_mixed_ranks_is_not_sure():
    within = trials.compare_trials([100.0, 110.0, 104.0], [99.0, 101.0, 100.5])  # ranks apart, saving < spread
    assert within.result == trials.NOT_SURE and "within the trials' noise" in within.why
    mixed = trials.compare_trials([100.0, 90.0, 95.0], [92.0, 99.0, 93.0])
    assert mixed.result == trials.NOT_SURE
    few = trials.compare_trials([100.0, 101.0], [50.0, 51.0])
    assert few.result == trials.NOT_SURE and "3 are needed" in few.why


def test_a_busy_machine_never_turns_no_change_into_faster():
    """The same setting on both sides, each trial slowed by a load that comes and goes (up to 3x): over
    thousands of alternated comparisons, "faster" at most as often as the test's level says, and never
    "faster" where the saving is within the noise."""
    rng = random.Random(7)
    faster = 0
    runs = 2000
    for _ in range(runs):
        load = [1.0 + 2.0 * rng.random() ** 3 for _ in range(6)]  # alternated trials share the load's drift
        base = [50.0 * load[i] * (1 + 0.02 * rng.gauss(0, 1)) for i in (0, 2, 4)]
        cand = [50.0 * load[i] * (1 + 0.02 * rng.gauss(0, 1)) for i in (1, 3, 5)]
        result = trials.compare_trials(base, cand)
        faster += result.result == trials.FASTER
        if result.result == trials.FASTER:
            assert result.measured_ms > result.noise_ms
    assert faster / runs <= trials.ALPHA


def test_without_ties_many_trials_use_the_u_distribution_and_agree_with_enumeration(monkeypatch):
    rng = random.Random(3)
    lower = [rng.random() for _ in range(7)]
    upper = [rng.random() + 0.3 for _ in range(8)]
    exact = trials.rank_p_below(lower, upper)
    monkeypatch.setattr(trials, "MAX_ASSIGNMENTS", 0)
    assert trials.rank_p_below(lower, upper) == pytest.approx(exact)
