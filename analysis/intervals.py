"""Interval arithmetic on numpy arrays: unions, differences and windowed overlaps.

Breakdowns are lengths of unions of event intervals (overlapping events on several
threads count once), with categories subtracted in priority order. Everything here
works on sorted, disjoint, half-open `(starts, ends)` int64 arrays in nanoseconds, with
integer arithmetic only: timestamps may be absolute (~1.8e18 ns since 1970), where
float64 cannot tell neighbouring nanoseconds apart.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]


def empty() -> Intervals:
    return np.array([], dtype=np.int64), np.array([], dtype=np.int64)


def union(starts, ends) -> Intervals:
    """Merge possibly overlapping intervals into sorted disjoint ones."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return empty()
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    new_block = np.empty(starts.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = starts[1:] > running_end[:-1]
    block = np.cumsum(new_block) - 1
    merged_starts = starts[new_block]
    merged_ends = np.zeros(merged_starts.size, dtype=np.int64)
    np.maximum.at(merged_ends, block, ends)
    return merged_starts, merged_ends


def union_of(*parts: Intervals) -> Intervals:
    if not parts:
        return empty()
    return union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def subtract(keep: Intervals, remove: Intervals) -> Intervals:
    """`keep` minus `remove`; both sorted and disjoint."""
    k_starts, k_ends = keep
    r_starts, r_ends = remove
    if k_starts.size == 0 or r_starts.size == 0:
        return keep
    # Walk the elementary segments between all edges. Each segment [edge_i, edge_i+1) lies
    # wholly inside or outside every half-open interval, so its left edge, an exact int64,
    # classifies it (a float midpoint does not: near 1.8e18 ns float64 steps are 256 ns).
    edges = np.sort(np.concatenate([_edges(k_starts, k_ends), _edges(r_starts, r_ends)]), kind="stable")
    edges = edges[np.concatenate(([True], edges[1:] != edges[:-1]))]
    lefts = edges[:-1]
    in_keep = _contains(k_starts, k_ends, lefts)
    in_remove = _contains(r_starts, r_ends, lefts)
    inside = in_keep & ~in_remove
    return union(edges[:-1][inside], edges[1:][inside])


def _edges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Starts and ends of sorted, disjoint intervals, interleaved: one sorted run, so that a stable
    sort (a merge of runs) of two of them costs a pass, where `np.unique`'s hashing cost many."""
    both = np.empty(starts.size * 2, dtype=np.result_type(starts, ends))
    both[0::2], both[1::2] = starts, ends
    return both


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Parts of `a` that are also in `b`; both sorted and disjoint."""
    return subtract(a, subtract(a, b))


def _contains(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    index = np.searchsorted(starts, points, side="right") - 1
    valid = index >= 0
    result = np.zeros(points.size, dtype=bool)
    result[valid] = points[valid] < ends[index[valid]]
    return result


def covered_before(intervals: Intervals, points) -> np.ndarray:
    """Total covered length in (-inf, t) for each t: the cumulative coverage function."""
    starts, ends = intervals
    points = np.asarray(points, dtype=np.int64)
    if starts.size == 0:
        return np.zeros(points.size, dtype=np.int64)
    lengths = ends - starts
    cumulative = np.concatenate([[0], np.cumsum(lengths)])
    index = np.searchsorted(starts, points, side="right")  # intervals starting before t
    full = cumulative[index]
    last = index - 1
    valid = last >= 0
    overhang = np.zeros(points.size, dtype=np.int64)
    overhang[valid] = np.maximum(ends[last[valid]] - points[valid], 0)
    return full - overhang


def overlap(intervals: Intervals, window_starts, window_ends) -> np.ndarray:
    """Covered length inside each window [start, end), vectorized over windows."""
    return covered_before(intervals, window_ends) - covered_before(intervals, window_starts)


def total(intervals: Intervals) -> int:
    return int((intervals[1] - intervals[0]).sum())
