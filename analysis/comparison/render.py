"""The comparison as text, Markdown, JSON and CSV (formatting only)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from analysis import run_files
from analysis.compare.op_diff import describe
from analysis.compare.table import warnings


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {key: _jsonable(v) for key, v in value.items()}
    return value


def to_json(table: pd.DataFrame) -> dict:
    """`{"baseline": run, "fastest": run, "warnings": [...], "rows": [...]}`; NaN becomes null."""
    rows = [{key: _jsonable(value) for key, value in record.items()} for record in table.to_dict(orient="records")]
    return {"schema_version": run_files.SCHEMA_VERSION, "baseline": str(table.loc[table["baseline"], "run"].iloc[0]),
            "fastest": str(table.loc[table["fastest"], "run"].iloc[0]),
            "warnings": warnings(table), "rows": rows}


def to_csv_frame(table: pd.DataFrame) -> pd.DataFrame:
    frame = table.copy()
    frame["flags"] = frame["flags"].map("; ".join)
    frame["findings"] = frame["findings"].map(lambda found: " ".join(f["rule"] for f in found))
    frame["workers"] = frame["workers"].map(lambda workers: " ".join(w["run"] for w in workers))
    frame["epochs_used"] = frame["epochs_used"].map(lambda e: " ".join(map(str, e)))
    return frame


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The human table: rounded, memory in MiB, `*` on the baseline, `(ext)` on external rows."""
    out = pd.DataFrame()
    out["run"] = [f"{'(external)' if r['external'] else r['run']}{' *' if r['baseline'] else ''}"
                  for _, r in table.iterrows()]
    out["device"] = table["device"].astype(str)
    out["s/epoch"] = table["seconds_per_epoch"].map(lambda v: f"{v:.3g}")
    out["images/s"] = table["images_per_second"].map(_fmt(1))
    out["speedup"] = table["speedup"].map(lambda v: f"{v:.2f}x" if v < 10 else f"{v:.1f}x")
    for part, title in (("input", "input%"), ("compute", "compute%"), ("host", "host%"), ("epoch_level", "epoch%")):
        out[title] = table[f"{part}_pct"].map(_fmt(1))
    out["cpu% mean/p95"] = [_pair(a, b) for a, b in zip(table["cpu_util_mean_pct"], table["cpu_util_p95_pct"])]
    out["dev% mean/p95"] = [_pair(a, b) for a, b in zip(table["device_util_mean_pct"], table["device_util_p95_pct"])]
    out["host MiB"] = (table["host_mem_peak_bytes"] / 2**20).map(_fmt(0))
    out["dev MiB"] = (table["device_mem_peak_bytes"] / 2**20).map(_fmt(0))
    out["GFLOP/s (peak)"] = [
        "-" if pd.isna(a) else f"{a / 1e9:.0f} ({'-' if pd.isna(p) else f'{p / 1e9:.0f}'})"
        for a, p in zip(table["achieved_flops_per_second"], table["peak_flops_per_second"])]
    out["MFU%"] = table["mfu_pct"].map(_fmt(1))
    measured = [c for c in out.columns if (out[c] != "-").any()]
    return out[measured]  # columns nobody measured (e.g. utilization of external rows) are left out


def _fmt(digits: int):
    return lambda v: "-" if pd.isna(v) else f"{v:.{digits}f}"


def _pair(a, b) -> str:
    return "-" if pd.isna(a) else f"{a:.0f}/{b:.0f}"


def render_text(table: pd.DataFrame) -> str:
    out = [display_frame(table).to_string(index=False), "",
           f"* baseline: {table.loc[table['baseline'], 'run'].iloc[0]}; % columns are shares of the epoch "
           "(epoch% = validation and other work outside training steps)", "", "why:"]
    out += [f"  - {why}" for why in table["why"]]
    out += _worker_lines(table)
    out += _notes(table)
    out += warnings(table)
    return "\n".join(out) + "\n"


def _worker_lines(table: pd.DataFrame) -> list[str]:
    out = []
    for _, row in table.iterrows():
        for worker in row.get("workers") or []:
            out.append(f"  {row['run']} / {worker['run']}: {worker['seconds_per_epoch']:.3g} s/epoch, input "
                       f"{worker['input_pct']:.0f} %, compute {worker['compute_pct']:.0f} %, host {worker['host_pct']:.0f} %")
    return ["", "workers:", *out] if out else []


def _notes(table: pd.DataFrame) -> list[str]:
    notes = table.loc[table["external"] & (table["notes"] != ""), "notes"].unique()
    return [f"external: {note}" for note in notes]


def render_markdown(table: pd.DataFrame, plot_name: str | None = None) -> str:
    frame = display_frame(table)
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join(":---" if i < 2 else "---:" for i in range(len(frame.columns))) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    out = ["# devprof compare", "", header, rule, *rows, "",
           f"Baseline (*): `{table.loc[table['baseline'], 'run'].iloc[0]}`. Percentages are shares of the epoch.", "",
           "## Why", ""]
    out += [f"- {why}" for why in table["why"]]
    out += ["", *(f"- {note}" for note in _notes(table))] if _notes(table) else []
    flagged = warnings(table)
    if flagged:
        out += ["", "## Warnings", ""] + [f"- {w.removeprefix('warning: ')}" for w in flagged]
    if plot_name:
        out += ["", f"![seconds per epoch]({plot_name})"]
    return "\n".join(out) + "\n"


def render(table: pd.DataFrame, fmt: str, plot_name: str | None = None, op_diff: dict | None = None) -> str:
    """`fmt` is text, markdown, json or csv; `op_diff` (`rows`, `unit`, `gap`, `a`, `b`) adds the op diff."""
    if fmt == "json":
        document = to_json(table)
        if op_diff is not None:
            document["op_diff_unit"] = op_diff["unit"]
            document["op_diff"] = [{key: _jsonable(value) for key, value in record.items()}
                                   for record in op_diff["rows"].to_dict(orient="records")]
        return json.dumps(document, indent=2) + "\n"
    if fmt == "csv":
        return to_csv_frame(table).to_csv(index=False)
    text = render_markdown(table, plot_name) if fmt == "markdown" else render_text(table)
    if op_diff is not None:
        lines = describe(op_diff["rows"], op_diff["unit"], op_diff["gap"], op_diff["a"], op_diff["b"])
        if fmt == "markdown":
            lines = ["", f"## Op diff", "", lines[0], "", *(line.replace("  - ", "- ", 1) for line in lines[1:])]
        text += "\n" + "\n".join(lines) + "\n"
    return text
