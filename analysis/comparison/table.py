"""The comparison table: baseline, speed-ups, like-for-like flags, and each row's "why"."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.comparison.errors import CompareError
from analysis.comparison.explain import explain, facts_of, with_findings
from analysis.comparison.rows import COMPONENTS
from analysis.rules.finding_rules import findings
from analysis.rules.table import classify


def pick_baseline(table: pd.DataFrame, baseline: str | None = None) -> int:
    """Index of the baseline row: the one named (run name, path or device), else the slowest."""
    if baseline is not None:
        wanted = baseline.strip()
        stripped = wanted.rstrip("/")
        matches = [
            i
            for i, row in table.iterrows()
            if wanted in (row["run"], row["path"])
            or stripped in (row["run"], row["path"])
            or (isinstance(row["path"], str) and Path(row["path"]) == Path(stripped))
        ]  # external: no path
        if not matches:
            matches = [i for i, row in table.iterrows() if str(row["device"]).lower() == wanted.lower()]
        if not matches:
            raise CompareError(
                f"--baseline {baseline!r} matches no run or device; choose one of: {', '.join(map(str, table['run']))}"
            )
        if len(matches) > 1:
            raise CompareError(f"--baseline {baseline!r} matches {len(matches)} rows; name the run directory instead")
        return matches[0]
    if table["epoch_images_per_second"].notna().all():
        return int(table["epoch_images_per_second"].idxmin())
    return int(table["seconds_per_epoch"].idxmax())


def speedups(table: pd.DataFrame, base: int) -> pd.Series:
    """Throughput relative to the baseline: images/s ratio where both know their images, else s/epoch ratio."""
    b = table.loc[base]
    by_images = table["epoch_images_per_second"] / b["epoch_images_per_second"]
    by_seconds = b["seconds_per_epoch"] / table["seconds_per_epoch"]
    return by_images.where(by_images.notna(), by_seconds)


def flags_for(table: pd.DataFrame, base: int) -> list[list[str]]:
    """Why a row is not like-for-like with the baseline (batch size, images per epoch, status, one epoch)."""
    b = table.loc[base]
    out = []
    for i, row in table.iterrows():
        flags = []
        if i != base:
            for column, what in (("batch_size", "batch size"), ("images_per_epoch", "images per epoch")):
                mine, theirs = row[column], b[column]
                if not (pd.isna(mine) or pd.isna(theirs)) and mine != theirs:
                    flags.append(f"{what} {mine:g} vs {theirs:g} in the baseline ({b['run']})")
        if not row["external"] and row["status"] not in ("complete", None):
            flags.append(f"run status is {row['status']!r}")
        if not row["external"] and row["epochs"] == 1:
            flags.append("only one epoch: it includes tracing and compilation")
        out.append(flags)
    return out


def compare(rows: list[dict], baseline: str | None = None) -> pd.DataFrame:
    """The comparison table: rows plus `speedup`, per-image ms of each component, `bound`, `flags`, `why`.

    The baseline (speed-up 1) is the row named by `baseline`, else the slowest. Each row's
    `why` explains its gap to the fastest row.
    """
    if not rows:
        raise CompareError("nothing to compare: pass run directories and/or --external FILE")
    table = pd.DataFrame(rows).reset_index(drop=True)
    base = pick_baseline(table, baseline)
    table["speedup"] = speedups(table, base)
    table["baseline"] = table.index == base
    for part in COMPONENTS:
        table[f"{part}_ms_per_image"] = 1000.0 * table[f"{part}_s"] / table["images_per_epoch"]
    table["bound"] = [classify(facts_of(r))[0] if not pd.isna(r["input_pct"]) else None for _, r in table.iterrows()]
    table["flags"] = flags_for(table, base)
    repeated = table["device"].duplicated(keep=False)
    table["label"] = table["device"].where(~repeated, table["run"])  # same device twice: name the runs
    fastest = table.loc[int(table["speedup"].idxmax())]
    table["fastest"] = table["run"] == fastest["run"]
    table["findings"] = [findings(facts_of(r)) if not r["external"] else [] for _, r in table.iterrows()]
    table["why"] = [with_findings(explain(r, fastest), r["findings"]) for _, r in table.iterrows()]
    return table


def warnings(table: pd.DataFrame) -> list[str]:
    return [f"warning: {row['run']}: {flag}" for _, row in table.iterrows() for flag in row["flags"]]
