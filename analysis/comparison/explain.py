"""Why a row is slower than the fastest: the component that explains the gap, and its fix.

Per-image time of each component is compared with the fastest row; the fix comes from
the rules table (`analysis.rules`), the same that gives `analyze` its advice.
"""

from __future__ import annotations

import pandas as pd

from analysis.comparison.rows import COMPONENTS
from analysis.rules.facts import Facts, make_facts
from analysis.rules.table import classify, fix_for

NO_GAP_SHARE = 0.01  # a per-image gap under 1 % of the fastest row's time is noise, not a finding
LABELS = {
    "input": "input",
    "compute": "compute",
    "collective": "collective wait",
    "host": "host overhead",
    "epoch_level": "epoch-level work (validation, iterator set-up)",
}


def facts_of(row) -> Facts:
    """The rules' view of a row: shares of its epoch, its device and settings."""
    return make_facts(
        input_pct=row.get("input_pct"),
        compute_pct=row.get("compute_pct"),
        host_pct=row.get("host_pct"),
        collective_pct=row.get("collective_pct"),
        device=row.get("kind"),
        precision=row.get("precision"),
        jit_compile=row.get("jit_compile"),
        steps_per_call=row.get("steps_per_call"),
        steps_per_epoch=row.get("steps_per_epoch"),
        prefetches=row.get("prefetches"),
        mfu_pct=row.get("mfu_pct"),
        peak_dtype=row.get("peak_dtype"),
        other_cpu_pct=row.get("other_cpu_mean_pct"),
        proc_cpu_pct=row.get("proc_cpu_mean_pct"),
        cpu_cores=row.get("cpu_cores"),
        bfloat16_units=row.get("bfloat16_units"),
        matrix_ceilings=row.get("matrix_flops_per_second"),
        ceilings_source="run.json peak",
        device_mem_peak_bytes=row.get("device_mem_peak_bytes"),
        device_mem_total_bytes=row.get("device_mem_total_bytes"),
    )


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
        assert bound is not None  # compute-bound applies to every row
        part = bound
        return (
            f"{device}: fastest ({row['seconds_per_epoch']:.3g} s/epoch), {bound}-bound: "
            f"{_parts_text(row)}; {advice(row, part)}"
        )
    ratio = _slower_ratio(row, fastest)
    if _same_images(row, fastest):
        numbers = f"{row['seconds_per_epoch']:.3g} vs {fastest['seconds_per_epoch']:.3g} s/epoch"
    else:
        numbers = (
            f"{row['epoch_images_per_second']:.0f} vs {fastest['epoch_images_per_second']:.0f} images/s "
            "over whole epochs"
        )
    head = f"{device}: {times(ratio)} slower than {other} ({numbers})"
    if not has_parts:
        return f"{head}; measured elsewhere, no breakdown: run it under 'devprof run' to see why"
    if not fastest_parts:
        part = max(COMPONENTS, key=lambda p: row[f"{p}_pct"])
        return (
            f"{head}; the faster one has no breakdown; here {LABELS[part]} is {row[f'{part}_pct']:.0f} % "
            f"of the epoch ({_parts_text(row)}); {advice(row, part)}"
        )
    # Runs that train different numbers of images: the training part is compared per image, and
    # epoch-level work (validation of a fixed set, iterator set-up) on its own, since per training
    # image it weighs more the fewer images an epoch trains.
    per_image = _images_known(row, fastest)
    separate = per_image and not _same_images(row, fastest)
    parts = TRAINING_PARTS if separate else COMPONENTS
    cost = _per_image_ms if per_image else _per_epoch_s
    unit = "ms/image" if per_image else "s/epoch"
    gaps = {p: cost(row, p) - cost(fastest, p) for p in parts}
    total = sum(gaps.values())
    fastest_cost = sum(cost(fastest, p) for p in parts)
    level = (
        (
            f"; epoch-level work is apart, as the runs train different numbers of images: "
            f"{row['epoch_level_s']:.3g} vs {fastest['epoch_level_s']:.3g} s per epoch"
        )
        if separate
        else ""
    )
    if not total > NO_GAP_SHARE * fastest_cost:
        if separate:
            return (
                f"{head}; training costs the same per image ({sum(cost(row, p) for p in parts):.3g} vs "
                f"{fastest_cost:.3g} ms/image){level}; {advice(row, 'epoch_level')}"
            )
        return (
            f"{device}: as fast as {other} ({row['seconds_per_epoch']:.3g} vs "
            f"{fastest['seconds_per_epoch']:.3g} s/epoch): no gap to explain"
        )
    # Shares are of the parts that got slower, so each lies in 0-100 %; parts that got
    # faster are named as such instead of pushing another part's share past 100 %.
    slower = {p: g for p, g in gaps.items() if g > 0}
    part = max(slower, key=lambda name: slower[name])
    share = 100.0 * slower[part] / sum(slower.values())
    mine, theirs = cost(row, part), cost(fastest, part)
    faster = [
        f"{_short(p)} {-g:.3g} {unit} faster" for p, g in gaps.items() if g < 0 and -g > NO_GAP_SHARE * fastest_cost
    ]
    offset = f", while {' and '.join(faster)}" if faster else ""
    training = " of training" if separate else ""
    return (
        f"{head}; {LABELS[part]} explains {share:.0f} % of the {total:.3g} {unit} gap{training} "
        f"({mine:.3g} vs {theirs:.3g} {unit}; {row[f'{part}_pct']:.0f} % {_short(part)} in its epoch{offset})"
        f"{level}; {_setting_advice(row, fastest, part) or advice(row, part)}"
    )


def _setting_advice(row, fastest, part: str) -> str | None:
    """Where the slower run differs from the fastest on the same kind of device by a setting that changes
    its compute (XLA, precision), that setting is the slower one here: the advice says so."""
    if part != "compute" or row.get("kind") != fastest.get("kind"):
        return None
    mine, theirs = bool(row.get("jit_compile")), bool(fastest.get("jit_compile"))
    if mine != theirs:
        if mine:
            return (
                "the runs differ in XLA: this one compiles the step with XLA (`--jit-compile`, `jit_compile=True`) "
                "and the faster one does not: XLA is the slower setting on this device, so leave it off"
            )
        return (
            "the runs differ in XLA: the faster one compiles the step with XLA (`--jit-compile`, "
            "`jit_compile=True`): turn it on"
        )
    now, other = row.get("precision") or "float32", fastest.get("precision") or "float32"
    if now != other:
        return (
            f"the runs differ in precision: this one computes in {now}, the faster one in {other}, which is the "
            f"faster setting on this device: use {other}"
        )
    return None


TRAINING_PARTS = ("input", "compute", "collective", "host")


def times(ratio: float) -> str:
    """A speed ratio as the table shows it (`1.05x`, `80.0x`)."""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def _images_known(row, other) -> bool:
    return not (pd.isna(row["images_per_epoch"]) or pd.isna(other["images_per_epoch"]))


def _per_epoch_s(row, part: str) -> float:
    return row[f"{part}_s"]


def _short(part: str) -> str:
    return LABELS[part].split(" (")[0]


def _same_images(row, other) -> bool:
    mine, theirs = row["images_per_epoch"], other["images_per_epoch"]
    return pd.isna(mine) or pd.isna(theirs) or mine == theirs


def _slower_ratio(row, fastest) -> float:
    """How many times slower `row` is than `fastest`: the ratio of the table's speed-ups, so the
    sentence and the table say the same."""
    if "speedup" in row and not (pd.isna(row["speedup"]) or pd.isna(fastest["speedup"])) and row["speedup"] > 0:
        return fastest["speedup"] / row["speedup"]
    if not (pd.isna(row["epoch_images_per_second"]) or pd.isna(fastest["epoch_images_per_second"])):
        return fastest["epoch_images_per_second"] / row["epoch_images_per_second"]
    return row["seconds_per_epoch"] / fastest["seconds_per_epoch"]


def _per_image_ms(row, part: str) -> float:
    return 1000.0 * row[f"{part}_s"] / row["images_per_epoch"]


def per_image_gaps(row, fastest) -> dict[str, float]:
    """ms/image each component costs `row` more than `fastest` (negative: less)."""
    return {part: _per_image_ms(row, part) - _per_image_ms(fastest, part) for part in COMPONENTS}


def _parts_text(row) -> str:
    """Each part's share of the epoch; the collective wait only where there is one (several workers or devices)."""
    return ", ".join(
        f"{_short(p)} {row[f'{p}_pct']:.0f} %" for p in COMPONENTS if p != "collective" or row.get(f"{p}_pct", 0.0) > 0
    )
