"""Regression gates for a team's own CI: a run slower than its baseline, or a part of the
step over a limit, is named in one line and exits 3 (1 keeps meaning "failed")."""

from __future__ import annotations

import math
import re

import pandas as pd

from analysis.comparison.errors import CompareError

LIMIT_RE = re.compile(r"^\s*(input|compute|host|collective)\s*>\s*([0-9]+(?:\.[0-9]+)?)\s*%?\s*$")


def slower_than_baseline(table: pd.DataFrame, baseline: int, pct: float) -> list[str]:
    """Runs whose median steady ms per step (per image when batch sizes differ) is more than `pct` %
    above the baseline row's; one sentence per run."""
    base = table.loc[baseline]
    sizes = table["batch_size"].dropna().unique()
    column, unit = ("median_ms_per_image", "ms/image") if len(sizes) > 1 else ("median_step_ms", "ms/step")
    if math.isnan(base[column]):
        raise CompareError(f"--fail-if-slower: the baseline {base['run']} has no steps.csv to time its steps")
    failed = []
    for index, row in table.iterrows():
        if index == baseline or row["external"] or math.isnan(row[column]):
            continue
        slower = 100.0 * (row[column] / base[column] - 1.0)
        if slower > pct:
            failed.append(
                f"{row['run']} is {slower:.1f} % slower than {base['run']} "
                f"({row[column]:.4g} vs {base[column]:.4g} {unit}, median steady step; limit {pct:g} %)"
            )
    return failed


def parse_limits(spec: str) -> dict[str, float]:
    """`input>20,host>15` -> {"input": 20.0, "host": 15.0}; a bad spec raises ValueError."""
    limits = {}
    for part in spec.split(","):
        match = LIMIT_RE.match(part)
        if not match:
            raise ValueError(f"{part.strip()!r} is not PART>PCT (PART: input, compute, host, collective)")
        part_name, limit = match.group(1), float(match.group(2))
        if part_name in limits:
            raise ValueError(f"{part_name} is given twice ({spec!r}): give each part one limit")
        if limit > 100:
            raise ValueError(f"{part.strip()!r}: a share of step time is at most 100 %, so this limit never trips")
        limits[part_name] = limit
    return limits


def over_limits(mean: dict, limits: dict[str, float]) -> list[str]:
    """Parts of the mean step whose share is above its limit, one sentence each."""
    return [
        f"{part} is {mean.get(f'{part}_pct', 0.0):.1f} % of step time, above the {limit:g} % limit"
        for part, limit in limits.items()
        if mean.get(f"{part}_pct", 0.0) > limit
    ]
