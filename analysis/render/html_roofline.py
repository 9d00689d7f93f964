"""The report's op table and roofline: each op with known costs at its achieved FLOP/s against the
ceilings of its dtype, the ops with the most time at the lowest share of their ceiling numbered.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.render.html_charts import esc, legend, num
from analysis.render.html_page import _missing, _section, _table
from analysis.render.html_roofline_chart import (
    KIND_COLORS,
    MAX_ROOF_POINTS,
    MEMORY_COLOR,
    Roof,
    RoofPoint,
    roofline,
    si,
)
from analysis.render.names import distinct_names

TOP_OPS = 15
# The roofline columns of the op table (analysis/breakdown/roofline.py): four shown in the table, the rest in the
# chart's tooltips.
ROOF_TABLE = {"flops_per_second": "FLOP/s", "intensity": "FLOP/byte", "bound": "bound", "ceiling_pct": "% of ceiling"}
ROOF_HIDDEN = ("dtype", "kind", "kernel", "flops_per_step", "bytes_per_step", "bytes_per_second")
LABELLED_OPS = 5  # ops named on the chart: the most time at the lowest share of their ceiling
LABEL_CHARS, LABEL_CONTEXT = 36, 200  # a label's length, and how many of the busiest ops it is told apart from
CEILING_HOW = (
    "measure them with `devprof peak` before the run (or `devprof run --measure-peak`), or give them to "
    "`devprof analyze --peak-tflops` or `--peak-file`"
)


def _ops(analysis) -> str:
    if analysis.ops.empty:
        return ""
    shown = analysis.ops.head(TOP_OPS)
    # The op's program (XLA's names repeat across programs) prefixes its name; the counts behind the
    # FLOPs stay in ops.csv and the JSON.
    hidden = {*ROOF_HIDDEN, "program", "program_id", "executions_per_step"}
    table = shown[[c for c in shown.columns if c not in ROOF_TABLE and c not in hidden]].copy()
    if "program" in shown:
        table["op"] = [f"{p}/{o}" if isinstance(p, str) and p else o for p, o in zip(shown["program"], shown["op"])]
    known = [c for c in ROOF_TABLE if c in shown and _known(shown[c]).any()]
    for column in known:  # blank where unknown
        values = shown[column].tolist()
        if column == "flops_per_second":
            text = [si(float(v), "").strip() if _is_number(v) else "" for v in values]
        elif column == "intensity":
            text = [num(float(v)) if _is_number(v) else "" for v in values]
        elif column == "ceiling_pct":
            text = [f"{float(v):.1f}" if _is_number(v) else "" for v in values]
        else:
            text = [str(v) if isinstance(v, str) else "" for v in values]
        table[ROOF_TABLE[column]] = text
    return _section(
        "Top ops",
        f'<p class="caption">The {len(shown)} slowest of {len(analysis.ops):,} ops, ms per '
        "training step and share of op time (all of them in ops.csv)"
        + (
            "; FLOP/s achieved, FLOPs per byte, what bounds the op and its share of that ceiling where "
            "its costs are known"
            if known
            else ""
        )
        + ".</p>",
        _table(table, name_columns=("op", "type", "device"), right=[ROOF_TABLE[c] for c in known if c != "bound"]),
        anchor="ops",
    )


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(float(value))


def _number(value) -> float:
    """A finite number as float, anything else (None, NaN, text) as NaN."""
    return float(value) if _is_number(value) else math.nan


def _known(column: pd.Series) -> pd.Series:
    if pd.api.types.is_numeric_dtype(column):
        return pd.Series(np.isfinite(column.to_numpy(dtype=float)), index=column.index)
    return column.map(lambda v: isinstance(v, str) and v != "")


def _roof_points(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops drawn on the roofline: known FLOP/s and intensity above zero, and time."""
    if not all(c in ops for c in ("flops_per_second", "intensity", "ms_per_step")):
        return ops.iloc[:0]
    values = {c: ops[c].to_numpy(dtype=float) for c in ("flops_per_second", "intensity", "ms_per_step")}
    keep = np.logical_and.reduce([np.isfinite(v) & (v > 0) for v in values.values()])
    return ops[keep]


def _text(row: pd.Series, column: str) -> str:
    value = row.get(column, "")
    return value if isinstance(value, str) else ""


MIN_WARNED_SHARE = 0.01  # of the drawn ops' time: a dtype below it gets no "unknown ceilings" warning


def _roofs(ceilings: dict, dtypes: list[str]) -> tuple[list[Roof], list[str]]:
    """The ceilings of the dtypes the ops run in (all of them when the ops name none that has ceilings),
    and what is unknown among them."""
    chosen = [d for d in dtypes if d in ceilings] or list(ceilings)
    roofs, unknown = [], []
    for dtype in chosen:
        given = ceilings.get(dtype)
        values: dict = given if isinstance(given, dict) else {}

        def value(key: str) -> float:
            v = _number(values.get(key))
            return v if v > 0 else math.nan

        roof = Roof(
            "any dtype" if dtype == "*" else str(dtype),
            value("matrix_flops_per_second"),
            value("vector_flops_per_second"),
            value("memory_bytes_per_second"),
        )
        roofs.append(roof)
        for what, v in (("matrix", roof.matrix), ("vector", roof.vector), ("memory bandwidth", roof.bandwidth)):
            if v != v:
                unknown.append(f"{dtype} {what}")
    unknown += [f"{d} (none given)" for d in dtypes if d and d not in ceilings]
    return roofs, unknown


def _roofline(analysis) -> str:
    """Each op with known costs on a log-log roofline against the ceilings of its dtype."""
    ops = analysis.ops
    if ops.empty:
        return ""
    info = getattr(analysis, "roofline", None) or {}
    # The two notes this section says in its own words are left out.
    notes = [
        str(n)
        for n in [info.get("note"), *(info.get("notes") or [])]
        if isinstance(n, str) and n and not n.startswith("no op costs") and "ceilings unknown" not in n
    ]
    note = "".join(f'<p class="caption">{esc(n[:1].upper() + n[1:])}.</p>' for n in notes)
    drawn = _roof_points(ops)
    if drawn.empty:
        costed = [c for c in ("flops_per_step", "bytes_per_step") if c in ops]
        known = len(costed) == 2 and bool((_known(ops["flops_per_step"]) & _known(ops["bytes_per_step"])).any())
        why = (
            "the ops with known FLOPs and bytes do no arithmetic"
            if known
            else "no traced op has known FLOPs and bytes (they come from the run's op_costs.csv, recorded at capture, "
            "or from HLO shapes in the trace, and neither gave any)"
        )
        return _section("Roofline", _missing(f"No roofline: {why}."), note, anchor="roofline")
    total = len(drawn)
    drawn = drawn.sort_values("ms_per_step", ascending=False, kind="stable").head(MAX_ROOF_POINTS)
    dtypes = list(dict.fromkeys(d for d in drawn["dtype"] if isinstance(d, str))) if "dtype" in drawn else []
    given = info.get("ceilings")
    roofs, unknown = _roofs(given if isinstance(given, dict) else {}, [d for d in dtypes if d])
    # Only what a measurement could fill and what matters: devprof peak measures floating-point dtypes,
    # and a dtype with a sliver of the op time is not worth a warning.
    time_by_dtype = drawn.groupby(drawn["dtype"].astype(str))["ms_per_step"].sum() if "dtype" in drawn else None
    total_ms = float(drawn["ms_per_step"].sum())
    unknown = [
        u
        for u in unknown
        if u.split(" ")[0] in ("*", "any")
        or (
            "float" in u.split(" ")[0]
            and time_by_dtype is not None
            and total_ms > 0
            and float(time_by_dtype.get(u.split(" ")[0], 0.0)) >= MIN_WARNED_SHARE * total_ms
        )
    ]
    ms = drawn["ms_per_step"].to_numpy(dtype=float)
    pct = drawn["ceiling_pct"].to_numpy(dtype=float) if "ceiling_pct" in drawn else np.full(len(drawn), np.nan)
    # Most time at the lowest share of its ceiling (without ceilings: most time).
    score = np.where(np.isfinite(pct), ms * (1 - np.clip(pct, 0, 100) / 100), ms)
    order = [i for i in np.argsort(-score, kind="stable")[:LABELLED_OPS] if score[i] > 0]
    # Shortened against the busiest ops around them, so that a label still tells its op from its neighbours'.
    context = list(dict.fromkeys([*order, *range(min(len(drawn), LABEL_CONTEXT))]))
    full = [
        f"{p}/{o}" if isinstance(p, str) and p else str(o)  # XLA's op names repeat across programs
        for p, o in zip(drawn["program"] if "program" in drawn else [""] * len(drawn), drawn["op"])
    ]
    names = distinct_names([full[i] for i in context], LABEL_CHARS)
    labels = dict(zip(order, names))
    points = []
    for i, (_, row) in enumerate(drawn.iterrows()):
        kind = _text(row, "kind")
        ceiling = " ".join(w for w in ("of its", _text(row, "dtype"), kind, "ceiling") if w)
        share = f"{pct[i]:.1f} % {ceiling}" if math.isfinite(pct[i]) else "ceiling unknown"
        bound = _text(row, "bound")
        time = f"{num(float(row['ms_per_step']))} ms per step"
        details = [
            full[i] + (f" ({row['type']})" if _text(row, "type") else ""),
            f"{si(float(row['flops_per_second']), 'FLOP/s')} at {num(float(row['intensity']))} FLOP/byte",
            share + (f", {bound}-bound" if bound else ""),
            time,
        ]
        if _text(row, "kernel"):
            details.append(f"kernel {row['kernel']}")
        points.append(
            RoofPoint(
                float(row["intensity"]),
                float(row["flops_per_second"]),
                float(row["ms_per_step"]),
                kind if kind in KIND_COLORS else "",
                "\n".join(details),
                labels.get(i, ""),
                f": {time}, {share}",
            )
        )
    # The labelled ops first, the least efficient first: the chart numbers them in this order.
    points = [points[i] for i in order] + [p for i, p in enumerate(points) if i not in labels]
    svg = roofline(points, roofs, "roofline: achieved FLOP/s against arithmetic intensity per op")
    kinds = {p.kind for p in points}
    known = any(v == v for r in roofs for v in (r.matrix, r.vector, r.bandwidth))  # any ceiling drawn
    roof = " and their roof" if known else ""
    keys = [
        (name, KIND_COLORS[kind])
        for kind, name in (
            ("matrix", f"matrix ops (convolutions, matmuls){roof}"),
            ("vector", f"vector ops{roof}"),
            ("", "ops of unknown kind"),
        )
        if kind in kinds
    ]
    if any(r.bandwidth == r.bandwidth for r in roofs):
        keys.append(("memory bandwidth", MEMORY_COLOR))
    styles = ["solid", "dashed", "dotted", "dash-dot"]
    extra = (
        (f'<span class="key">lines: {esc(", ".join(f"{r.dtype} {styles[k % 4]}" for k, r in enumerate(roofs)))}</span>')
        if len(roofs) > 1 and known
        else ""
    )
    source = info.get("ceilings_source")
    sentences = [
        f"Each circle is an op with known FLOPs and bytes, its area its time per step ({total:,} of "
        f"{len(ops):,} ops"
        + (f", {float(info['known_time_pct']):.1f} % of op time" if _is_number(info.get("known_time_pct")) else "")
        + ")"
        + (f"; the {MAX_ROOF_POINTS:,} slowest are drawn" if total > MAX_ROOF_POINTS else "")
        + "."
        + (" An op is bound by the lower of its roofs: the memory slope or its flat ceiling." if known else "")
        + " Numbered: the ops with the most time at the lowest share of their ceiling."
    ]
    if known:
        sentences.append(f"Ceilings from {source}." if isinstance(source, str) and source else "")
    flops, model = _number(info.get("flops_per_step")), _number(info.get("model_flops_per_step"))
    achieved, mfu = _number(info.get("achieved_flops_per_second")), _number(info.get("mfu_pct"))
    if flops == flops:
        sentences.append(
            f"FLOPs per step: {si(flops, 'FLOP')}"
            + (f" (model: {si(model, 'FLOP')})" if model == model else "")
            + (
                f", {si(achieved, 'FLOP/s')} achieved {info.get('achieved_over') or ''}".rstrip()
                if achieved == achieved
                else ""
            )
            + (
                f", MFU {mfu:.1f} % of the {info.get('dtype') or ''} matrix ceiling over the same ops".replace(
                    "  ", " "
                )
                if mfu == mfu
                else ""
            )
            + "."
        )
    caption = f'<p class="caption">{esc(" ".join(s for s in sentences if s))}</p>'
    if not known:
        warning = _missing(f"The ceilings are unknown, so only the ops are drawn: {CEILING_HOW}.")
    elif unknown:
        warning = _missing(f"Unknown ceilings ({', '.join(unknown)}): {CEILING_HOW}.")
    else:
        warning = ""
    return _section("Roofline", legend(keys, extra), svg, caption, warning, note, anchor="roofline")
