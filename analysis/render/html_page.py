"""The page every HTML report is: its style sheet and the Content-Security-Policy that keeps it
offline, its sections, and tables whose cells right-align figures and wrap long names only at their
separators; and how many steps share a bar of the step chart, which the lines drawn under it follow.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from analysis.render.html_charts import MAX_BARS, esc
from analysis.render.names import distinct_names

NUMBER_TEXT = re.compile(r"[-+]?[\d.,]+\s*(x|%|[\d.,/ ()-]*)")  # "1.00x", "99/100", "22 (-)": right-aligned
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
:root{color-scheme:light}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1d1d1f;
 background:#fafafa;margin:0}
main{max-width:1140px;margin:0 auto;padding:20px 24px 40px;background:#fff}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e3e3e3;padding-bottom:4px}
h3{font-size:14px;margin:16px 0 6px}
p,ul{margin:6px 0}
.meta{color:#555;margin:0;padding-left:18px;font-size:13px}
.verdict{border-left:6px solid #888;background:#f6f6f6;padding:10px 14px;margin:14px 0}
.verdict h2{border:0;margin:0 0 4px;padding:0;font-size:18px}
.verdict.input{border-color:#d62728;background:#fdf0f0}
.verdict.host{border-color:#1f77b4;background:#eef5fb}
.verdict.compute{border-color:#2ca02c;background:#eff8ef}
.verdict a{color:inherit}
.chart{display:block;width:100%;height:auto}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:#333;margin:4px 0 2px}
.key i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-2px;border:1px solid #0002}
.caption{font-size:13px;color:#444}
.missing{color:#8a5a00;background:#fff8e6;border:1px solid #f0d9a8;padding:6px 10px;display:inline-block}
.finding{margin:8px 0;padding:6px 10px;border-left:4px solid #bbb;background:#fafafa}
.oom{border-left:6px solid #d62728;background:#fdf0f0;padding:4px 14px 8px;margin:10px 0}
.oom h3{color:#a51d1d}
.oom table{background:#fff}
.finding.warning{border-color:#e08a00}.finding.error,.finding.critical{border-color:#d62728}
.sev{font-size:11px;text-transform:uppercase;font-weight:600;color:#fff;background:#888;border-radius:3px;
 padding:1px 5px;margin-right:6px}
.warning .sev{background:#c77700}.error .sev,.critical .sev{background:#d62728}
.scroll{overflow-x:auto}
main>section>.scroll{--bleed:max(0px,(100vw - 1140px)/2);display:grid;width:calc(100vw - 48px);
 margin-left:calc(-1 * var(--bleed));grid-template-columns:minmax(0,var(--bleed)) minmax(min-content,max-content)}
main>section>.scroll>table{grid-column:2;background:#fff}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f3f3f3;font-weight:600;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.name{overflow-wrap:anywhere;max-width:520px}
td.path{overflow-wrap:normal}
tr.straggler td{background:#fdecec;font-weight:600}
tr:nth-child(even) td{background:#fbfbfb}
.memrow{display:grid;grid-template-columns:minmax(0,11fr) minmax(0,9fr);gap:0 16px;align-items:start}
@media (max-width:800px){.memrow{grid-template-columns:1fr}}
.kv{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:0 24px}
.kv table{width:100%}
.kv td:first-child{color:#555;white-space:nowrap;width:40%}
code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f3f3f3;padding:0 3px}
footer{margin-top:30px;color:#777;font-size:12px}
@media print{
 body{background:#fff;font-size:11px}
 main{max-width:none;padding:0}
 *{-webkit-print-color-adjust:exact;print-color-adjust:exact}
 section,figure,.finding,table{break-inside:avoid}
 h2{break-after:avoid}
 .scroll{overflow:visible}
 main>section>.scroll{display:block;width:auto;margin-left:0}
 td.name{max-width:none}
}
"""


# ---------------------------------------------------------------- page


def _page(title: str, body: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body><main>\n"
        + "\n".join(part for part in body if part)
        + "\n<footer>devprof report: one file, nothing loaded from the network. Hover a bar for its numbers."
        "</footer>\n</main></body></html>\n"
    )


def _section(title: str, *content: str, anchor: str = "") -> str:
    ident = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{ident}><h2>{esc(title)}</h2>" + "".join(c for c in content if c) + "</section>"


def _missing(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def _cell(value) -> tuple[str, bool]:
    """(text, numeric) of a table cell."""
    if value is None:
        return "-", False
    if isinstance(value, (bool, np.bool_)):
        return ("yes" if value else "no"), False
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}", True
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return "-", True
        if value == int(value) and abs(value) < 1e15:
            return f"{int(value):,}", True
        return (f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 1 else f"{value:,.2f}"), True
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str), False
    text = str(value)
    return text, bool(NUMBER_TEXT.fullmatch(text)) and any(ch.isdigit() for ch in text)


HTML_NAME = 90  # characters of a name in a table cell; the whole name is its tooltip
_BREAK_AFTER = re.compile(r"(?<=.)(/|::)")


def _name_cell(name, shown) -> str:
    """A name that wraps only after its `/` and `::` separators (never inside a word such as
    `/host:CPU`), its whole text as the tooltip where it is shortened."""
    text = _cell(shown)[0]
    title = f' title="{esc(str(name))}"' if shown != name else ""
    return f'<td class="name path"{title}>' + _BREAK_AFTER.sub(r"\1<wbr>", esc(text)) + "</td>"


def _table(frame: pd.DataFrame, highlight=None, name_columns=(), right=()) -> str:
    """A DataFrame as an HTML table; `highlight(row) -> bool` marks rows (the straggler). Names in
    `name_columns` are shortened so that the rows stay told apart (`render.names`); columns in
    `right` are figures already formatted as text (right-aligned)."""
    head = "".join(f"<th>{esc(c)}</th>" for c in frame.columns)
    shortened = {c: distinct_names(frame[c].tolist(), HTML_NAME) for c in name_columns if c in frame}
    rows = []
    for index, (_, row) in enumerate(frame.iterrows()):
        cells = []
        for column, value in row.items():
            text, numeric = _cell(value)
            numeric = numeric or column in right
            if column in shortened and not numeric:
                cells.append(_name_cell(value, shortened[column][index]))
                continue
            cls = ' class="n"' if numeric else ' class="name"' if column in name_columns else ""
            cells.append(f"<td{cls}>{esc(text)}</td>")
        mark = ' class="straggler"' if highlight is not None and highlight(row) else ""
        rows.append(f"<tr{mark}>{''.join(cells)}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _key_values(title: str, values: dict) -> str:
    if not values:
        return ""
    rows = "".join(f'<tr><td>{esc(k)}</td><td class="name">{esc(_cell(v)[0])}</td></tr>' for k, v in values.items())
    return f"<div><h3>{esc(title)}</h3><table>{rows}</table></div>"


# The step chart's bars (html.py), which the utilization lines drawn on its axis follow.
def _step_bins(steps: pd.DataFrame) -> int:
    """How many consecutive steps go into one bar."""
    return max(1, math.ceil(len(steps) / MAX_BARS))
