"""Interval arithmetic is exact at session-relative and at absolute-nanosecond scales."""

import numpy as np
import pytest

from analysis import intervals as iv

ABSOLUTE_NS = 1_800_000_000_000_000_123  # an epoch-based timestamp, where float64 steps are 256 ns


def spans(*pairs):
    return iv.union([a for a, _ in pairs], [b for _, b in pairs])


@pytest.mark.parametrize("base", [0, 1_234_567, ABSOLUTE_NS])
def test_intersect_and_subtract_are_exact(base):
    a = spans((base + 3, base + 100))
    b = spans((base + 50, base + 120))
    assert iv.total(iv.intersect(a, b)) == 50
    assert [x.tolist() for x in iv.intersect(a, b)] == [[base + 50], [base + 100]]
    assert iv.total(iv.subtract(a, b)) == 47
    assert [x.tolist() for x in iv.subtract(b, a)] == [[base + 100], [base + 120]]


@pytest.mark.parametrize("base", [0, ABSOLUTE_NS])
def test_one_nanosecond_segments_survive(base):
    keep = spans((base, base + 10), (base + 20, base + 30))
    remove = spans((base + 1, base + 9), (base + 21, base + 22), (base + 29, base + 40))
    diff = iv.subtract(keep, remove)
    assert [x.tolist() for x in diff] == [
        [base, base + 9, base + 20, base + 22],
        [base + 1, base + 10, base + 21, base + 29],
    ]
    assert iv.total(diff) == 1 + 1 + 1 + 7
    assert iv.overlap(diff, [base + 9], [base + 21]).tolist() == [2]


def test_results_stay_int64():
    a = spans((ABSOLUTE_NS, ABSOLUTE_NS + 5))
    for result in (iv.subtract(a, spans((ABSOLUTE_NS + 1, ABSOLUTE_NS + 2))), iv.intersect(a, a)):
        assert result[0].dtype == np.int64 and result[1].dtype == np.int64
