"""Why a row is slower than the fastest: the component that explains the gap, and its fix.

Per-image time of each component is compared with the fastest row; the fix comes from
the rules table (`analysis.rules`), the same that gives `analyze` its advice.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.comparison.rows import COMPONENTS
from analysis.rules import Facts, classify, facts_from, fix_for

NO_GAP_SHARE = 0.01  # a per-image gap under 1 % of the fastest row's time is noise, not a finding
LABELS = {"input": "input", "compute": "compute", "host": "host overhead",
          "epoch_level": "epoch-level work (validation, iterator set-up)"}


def facts_of(row) -> Facts:
    """The rules' view of a row: shares of its epoch, its device and settings."""
    return facts_from({**row, "device": row.get("kind") or ""})


def with_findings(why: str, found: list[dict]) -> str:
    """The sentence, followed by each finding of the row (the same rules as analyze's)."""
    return "; ".join([why, *(f"{f['rule']}: {f['evidence']}" for f in found)])


def advice(row, component: str) -> str:
    """The change that fits a component of one row."""
    return fix_for(component, facts_of(row))


def explain(row: dict | pd.Series, fastest: dict | pd.Series) -> str:
    """Why `row` is slower than `fastest`, in one sentence with numbers and advice."""
    device = row.get("label", row["device"])
    other = fastest.get("label", fastest["device"])
    has_parts = not pd.isna(row["input_pct"])
    fastest_parts = not pd.isna(fastest["input_pct"])
    if row["run"] == fastest["run"]:
        if not has_parts:
            return f"{device}: fastest ({row['seconds_per_epoch']:.3g} s/epoch); measured elsewhere, no breakdown"
        bound, _ = classify(facts_of(row))
        part = {"input": "input", "host": "host", "compute": "compute"}[bound]
        return (f"{device}: fastest ({row['seconds_per_epoch']:.3g} s/epoch), {bound}-bound: "
                f"{_parts_text(row)}; {advice(row, part)}")
    ratio = _slower_ratio(row, fastest)
    if _same_images(row, fastest):
        numbers = f"{row['seconds_per_epoch']:.3g} vs {fastest['seconds_per_epoch']:.3g} s/epoch"
    else:
        numbers = (f"{row['epoch_images_per_second']:.0f} vs {fastest['epoch_images_per_second']:.0f} images/s "
                   "over whole epochs")
    head = f"{device}: {ratio:.1f}x slower than {other} ({numbers})"
    if not has_parts:
        return f"{head}; measured elsewhere, no breakdown: run it under 'devprof run' to see why"
    if not fastest_parts:
        part = max(COMPONENTS, key=lambda p: row[f"{p}_pct"])
        return (f"{head}; the faster one has no breakdown; here {LABELS[part]} is {row[f'{part}_pct']:.0f} % "
                f"of the epoch ({_parts_text(row)}); {advice(row, part)}")
    gaps = per_image_gaps(row, fastest)
    total = sum(gaps.values())
    fastest_ms = sum(_per_image_ms(fastest, p) for p in COMPONENTS)
    if not total > NO_GAP_SHARE * fastest_ms:
        return (f"{device}: as fast as {other} ({row['seconds_per_epoch']:.3g} vs "
                f"{fastest['seconds_per_epoch']:.3g} s/epoch): no gap to explain")
    # Shares are of the parts that got slower, so each lies in 0-100 %; parts that got
    # faster are named as such instead of pushing another part's share past 100 %.
    slower = {p: g for p, g in gaps.items() if g > 0}
    part = max(slower, key=slower.get)
    share = 100.0 * slower[part] / sum(slower.values())
    mine, theirs = _per_image_ms(row, part), _per_image_ms(fastest, part)
    faster = [f"{_short(p)} {-g:.3g} ms/image faster" for p, g in gaps.items() if g < 0 and -g > NO_GAP_SHARE * fastest_ms]
    offset = f", while {' and '.join(faster)}" if faster else ""
    return (f"{head}; {LABELS[part]} explains {share:.0f} % of the {total:.3g} ms/image gap "
            f"({mine:.3g} vs {theirs:.3g} ms/image; {row[f'{part}_pct']:.0f} % {_short(part)} in its epoch{offset}); "
            f"{advice(row, part)}")


def _short(part: str) -> str:
    return LABELS[part].split(" (")[0]


def _same_images(row, other) -> bool:
    mine, theirs = row["images_per_epoch"], other["images_per_epoch"]
    return pd.isna(mine) or pd.isna(theirs) or mine == theirs


def _slower_ratio(row, fastest) -> float:
    if not (pd.isna(row["epoch_images_per_second"]) or pd.isna(fastest["epoch_images_per_second"])):
        return fastest["epoch_images_per_second"] / row["epoch_images_per_second"]
    return row["seconds_per_epoch"] / fastest["seconds_per_epoch"]


def _per_image_ms(row, part: str) -> float:
    return 1000.0 * row[f"{part}_s"] / row["images_per_epoch"]


def per_image_gaps(row, fastest) -> dict[str, float]:
    """ms/image each component costs `row` more than `fastest` (negative: less)."""
    return {part: _per_image_ms(row, part) - _per_image_ms(fastest, part) for part in COMPONENTS}


def _parts_text(row) -> str:
    return ", ".join(f"{_short(p)} {row[f'{p}_pct']:.0f} %" for p in COMPONENTS)
