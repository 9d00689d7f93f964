"""One self-contained HTML page: `--format html`, `-o report.html` and `analysis/report.html`.

No network: no script, no web font, no external style sheet or image; the charts are inline
SVG (`html_charts`) and a Content-Security-Policy meta tag forbids the page to load anything,
so a copied report opens the same on an air-gapped machine. Hover details are SVG `<title>`
tooltips (no JavaScript). Every text from a trace, run.json or a run name is escaped. Like
every format, a pure function of the `Analysis` or `Comparison`: it selects, formats and
bins for drawing, never analyses.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.render import tables
from analysis.render.html_charts import (
    EPOCH_LEVEL_COLOR,
    KIND_COLORS,
    MAX_BARS,
    MAX_ROOF_POINTS,
    MEMORY_COLOR,
    OUTLIER_COLOR,
    PART_COLORS,
    SERIES_COLORS,
    Band,
    Bar,
    Roof,
    RoofPoint,
    Series,
    esc,
    hbars,
    heat_map,
    legend,
    lines,
    memory_timeline,
    nice_ticks,
    num,
    roofline,
    si,
    stacked_bars,
)
from analysis.render.names import distinct_names

NUMBER_TEXT = re.compile(r"[-+]?[\d.,]+\s*(x|%|[\d.,/ ()-]*)")  # "1.00x", "99/100", "22 (-)": right-aligned
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
TOP_OPS = 15
STEP_PARTS = ("input", "compute", "collective", "host")
# Per-step utilization columns (the sampler CSVs' names), where the steps carry them.
STEP_UTILIZATION = ("cpu_pct", "proc_cpu_pct", "proc_rss_bytes", "mem_used_bytes", "gpu_util_pct", "gpu_mem_used_bytes",
                    "mxu_util_pct")
COMPILE_KEY = "repeating-linear-gradient(45deg,#000 0 1.5px,#fff 1.5px 4px)"

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
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body><main>\n"
            + "\n".join(part for part in body if part)
            + "\n<footer>devprof report: one file, nothing loaded from the network. Hover a bar for its numbers."
              "</footer>\n</main></body></html>\n")


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
    rows = "".join(f"<tr><td>{esc(k)}</td><td class=\"name\">{esc(_cell(v)[0])}</td></tr>" for k, v in values.items())
    return f"<div><h3>{esc(title)}</h3><table>{rows}</table></div>"


# ---------------------------------------------------------------- analysis


def _run_name(analysis) -> str:
    config = analysis.run.get("config") if isinstance(analysis.run.get("config"), dict) else {}
    folder = analysis.job_dir or analysis.run_dir
    return str(config.get("run_name") or (folder.name if folder is not None else analysis.path.name))


def render_analysis(analysis) -> str:
    name = _run_name(analysis)
    steps_chart = _step_chart(analysis)
    body = [
        f"<header><h1>devprof analysis: {esc(name)}</h1>",
        "<ul class=\"meta\">" + "".join(f"<li>{esc(line)}</li>" for line in tables.header_lines(analysis)) + "</ul>"
        "</header>",
        _verdict(analysis),
        steps_chart,
        _utilization(analysis),
        _advice(analysis),
        _epochs(analysis),
        _devices(analysis),
        _workers(analysis),
        _memory(analysis),
        _roofline(analysis),
        _ops(analysis),
        _stages(analysis),
        _run_info(analysis),
    ]
    return _page(f"devprof analysis: {name}", body)


def _verdict(analysis) -> str:
    """The headline and its evidence; the advice follows the charts (so the step chart stays near the top)."""
    verdict = analysis.verdict
    bound = verdict.get("bound") or "none"
    more = ' <a href="#advice">Advice below.</a>' if verdict.get("advice") or analysis.findings else ""
    saving = "".join(f'<p class="saving">{esc(line[0].upper() + line[1:])}</p>'
                     for line in tables.verdict_saving_lines(verdict))
    return (f'<div class="verdict {esc(bound)}" id="verdict"><h2>Verdict: {esc(tables.verdict_title(verdict))}</h2>'
            f"<p>{esc(verdict.get('evidence', ''))}{more}</p>{saving}</div>")


def _step_parts(steps: pd.DataFrame) -> list[str]:
    return [p for p in STEP_PARTS if f"{p}_ms" in steps and (p != "collective" or (steps[f"{p}_ms"] > 0).any())]


def _step_bins(steps: pd.DataFrame) -> int:
    """How many consecutive steps go into one bar."""
    return max(1, math.ceil(len(steps) / MAX_BARS))


def _step_bars(analysis) -> tuple[list[Bar], list[str], int]:
    steps = analysis.steps
    parts = _step_parts(steps)
    per_bar = _step_bins(steps)
    noun = "call" if analysis.steps_per_call > 1 else "step"
    # Plain arrays: a bar per step of a long trace is hundreds of bars.
    part_ms = [steps[f"{p}_ms"].fillna(0.0).to_numpy(dtype=float) for p in parts]
    compile_all = steps["compile_ms"].fillna(0.0).to_numpy(dtype=float) if "compile_ms" in steps else None
    step_ms = steps["step_ms"].to_numpy(dtype=float)
    step_number = steps["step"].to_numpy()
    partial_all = steps["partial"].to_numpy(dtype=bool) if "partial" in steps else None
    bars = []
    for start in range(0, len(steps), per_bar):
        chunk = slice(start, start + per_bar)
        count = len(step_ms[chunk])
        values = tuple(float(column[chunk].mean()) for column in part_ms)
        compile_ms = float(compile_all[chunk].mean()) if compile_all is not None else 0.0
        total = float(step_ms[chunk].mean())
        split = " + ".join(f"{p} {num(v)}" for p, v in zip(parts, values))
        first, last = int(step_number[chunk][0]), int(step_number[chunk][-1])
        partial = partial_all is not None and bool(partial_all[chunk].all())
        if count == 1:
            title = f"{noun} {first}: {num(total)} ms = {split}"
            peak = None
        else:
            peak = float(step_ms[chunk].max())
            title = f"{noun}s {first}-{last} (mean of {count}): {num(total)} ms = {split}; slowest {num(peak)} ms"
        if compile_ms > 0:
            title += f" (compile {num(compile_ms)} ms, in host)"
        if partial:
            title += " - partial: cut by the trace's edge, left out of the means"
        bars.append(Bar(values, title, str(first), partial, compile_ms, peak))
    return bars, parts, per_bar


def _step_chart(analysis) -> str:
    steps = analysis.steps
    if steps.empty:
        return _section("Step time", _missing("no steps found"), anchor="steps")
    bars, parts, per_bar = _step_bars(analysis)
    noun = "calls" if analysis.steps_per_call > 1 else "steps"
    spread = analysis.spread
    svg, cut = stacked_bars(bars, [(p, PART_COLORS[p]) for p in parts], "ms", "step time by part",
                            hatch_after=parts.index("host"), x_title="call" if noun == "calls" else "step",
                            marked=_outlier_bars(analysis, per_bar), median=spread["median_ms"] if spread else None)
    keys = [(f"{p}" + (" overhead" if p == "host" else " wait" if p == "collective" else ""), PART_COLORS[p])
            for p in parts]
    if "compile_ms" in steps and (steps["compile_ms"] > 0).any():
        keys.append(("compile (inside host)", COMPILE_KEY))
    if spread and spread["outliers"]:
        keys.append(("over 1.5x the median (outlined; the cause on hover)", OUTLIER_COLOR))
    notes = []
    if per_bar > 1:
        notes.append(f"each bar is the mean of {per_bar} consecutive {noun}; the black tick is the slowest of them")
    if "partial" in steps and steps["partial"].any():
        notes.append("lighter bars: partial steps cut by the trace's edge, left out of the means")
    if cut:
        notes.append("a triangle marks a bar taller than the axis, with its value")
    if spread:
        notes.append(f"{tables.spread_line(analysis)}; the dashed line is the median")
    mean = analysis.mean
    split = " + ".join(f"{p} {mean.get(f'{p}_ms', 0.0):.2f} ms ({mean.get(f'{p}_pct', 0.0):.1f} %)" for p in parts)
    def counted(count: int, what: str = "") -> str:
        return f"{count:,} {what}{noun if count != 1 else noun[:-1]}"

    caption = (f'<p class="caption">{counted(len(steps))}; mean over {counted(analysis.steps_used, "steady ")}: '
               f"{mean.get('step_ms', 0.0):.2f} ms = {esc(split)}." + ("<br>" + esc("; ".join(notes)) if notes else "")
               + "</p>")
    return _section("Step time", legend(keys), svg, caption, anchor="steps")


# Words for a slow step's cause in a tooltip (JSON `spread.outliers[].cause`).
CAUSE_WORDS = {"device": "device work", "host": "host overhead", "input": "input wait", "collective": "collective wait"}
OUTLIERS_PER_BAR = 5


def _outlier_bars(analysis, per_bar: int) -> dict[int, str]:
    """Bar index -> tooltip naming the steps over 1.5x the median that the bar holds, and their causes."""
    spread = analysis.spread
    if not spread or not spread["outliers"]:
        return {}
    noun = "call" if analysis.steps_per_call > 1 else "step"
    median = spread["median_ms"]
    slow = {o["step"]: o for o in spread["outliers"]}
    numbers = analysis.steps["step"].to_numpy()
    named: dict[int, list[str]] = {}
    for position in np.flatnonzero(np.isin(numbers, list(slow))):
        o = slow.pop(int(numbers[position]), None)
        if o is None:  # a step number listed twice: its first row is the step
            continue
        texts = named.setdefault(int(position) // per_bar, [])
        texts.append(f"{noun} {o['step']}: {num(o['step_ms'])} ms ({o['step_ms'] / median:.1f}x the median), "
                     f"{CAUSE_WORDS.get(o['cause'], o['cause'])} {'+' if o['excess_ms'] >= 0 else ''}"
                     f"{tables.short_ms(o['excess_ms'], 2)} ms")
    return {bar: f"over 1.5x the median (median {num(median)} ms): " + "; ".join(texts[:OUTLIERS_PER_BAR])
            + (f"; {len(texts) - OUTLIERS_PER_BAR} more" if len(texts) > OUTLIERS_PER_BAR else "")
            for bar, texts in named.items()}


# ---------------------------------------------------------------- utilization


def _cores(analysis, frame: pd.DataFrame | None = None) -> float:
    cores = analysis.utilization.get("cpu_cores", math.nan) if analysis.utilization else math.nan
    if cores == cores and cores:
        return float(cores)
    if frame is not None:
        count = sum(1 for c in frame.columns if c.startswith("cpu") and c[3:-4].isdigit() and c.endswith("_pct"))
        return float(count) if count else math.nan
    return math.nan


def _utilization(analysis) -> str:
    steps = analysis.steps
    if not steps.empty and any(c in steps and steps[c].notna().any() for c in STEP_UTILIZATION):
        section = _utilization_per_step(analysis)
        if analysis.samplers:  # the traced steps are a window: the whole run gives the context
            section = section.replace("</section>", "<h3>Over the whole run</h3>" + _utilization_over_run(
                analysis, nested=True) + "</section>")
        return section
    if not analysis.samplers:
        why = ("a profiler trace on its own has no samplers; `devprof run` records them"
               if analysis.run_dir is None else "this run has no utilization/*.csv (sampling was off)")
        return _section("Utilization and memory", _missing(f"CPU, process and GPU utilization and memory: not "
                                                           f"recorded ({why})."), anchor="utilization")
    return _utilization_over_run(analysis)


def _recorded_line(found: dict[str, bool]) -> str:
    parts = [f"{what}: {'recorded' if ok else 'not recorded'}" for what, ok in found.items()]
    return f'<p class="caption">{esc("; ".join(parts))}.</p>'


def _bin_means(values: np.ndarray, per_bar: int) -> np.ndarray:
    if per_bar == 1:
        return values
    groups = np.arange(values.size) // per_bar
    sums = np.bincount(groups, weights=np.nan_to_num(values))
    counts = np.bincount(groups, weights=np.isfinite(values).astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.where(counts > 0, counts, 1), np.nan)


def _step_axis(analysis) -> tuple[tuple[float, float], list[tuple[float, str]], int]:
    """The step chart's x axis for lines drawn under it: range, ticks, steps per bar."""
    steps = analysis.steps
    per_bar = _step_bins(steps)
    bars = math.ceil(len(steps) / per_bar)
    every = max(1, math.ceil(bars / 16))
    ticks = [(i + 0.5, str(int(steps["step"].iloc[i * per_bar]))) for i in range(0, bars, every)]
    return (0.0, float(bars)), ticks, per_bar


def _utilization_per_step(analysis) -> str:
    """The steps' own utilization columns, one point per bar of the step chart."""
    steps = analysis.steps
    x_range, ticks, per_bar = _step_axis(analysis)
    x = np.arange(math.ceil(len(steps) / per_bar)) + 0.5
    cores = _cores(analysis)

    def column(name: str, scale: float = 1.0) -> np.ndarray:
        return _bin_means(steps[name].to_numpy(float) / scale, per_bar)

    def has(name: str) -> bool:
        return name in steps and bool(steps[name].notna().any())

    cpu, memory = [], []
    if has("cpu_pct"):
        cpu.append(Series("machine CPU %", x, column("cpu_pct"), "#1f77b4"))
    if has("proc_cpu_pct"):
        label = (f"training process CPU % (of all {cores:g} cores)" if cores == cores
                 else "training process CPU % (100 = one core)")
        cpu.append(Series(label, x, column("proc_cpu_pct", cores if cores == cores else 1.0), "#1f77b4", "4 3"))
    for name, label in (("gpu_util_pct", "GPU utilization % (mean of the GPUs)"), ("mxu_util_pct", "TPU matrix units %")):
        if has(name):
            cpu.append(Series(label, x, column(name), "#2ca02c"))
    for name, label, color, dash in (("proc_rss_bytes", "training process memory (RSS)", "#9467bd", ""),
                                     ("mem_used_bytes", "machine memory used", "#9467bd", "4 3"),
                                     ("gpu_mem_used_bytes", "GPU memory used (the fullest GPU)", "#ff7f0e", "")):
        if has(name):
            memory.append(Series(label, x, column(name, 2**30), color, dash))
    found = {"machine CPU": has("cpu_pct"), "process CPU": has("proc_cpu_pct"),
             "GPU": has("gpu_util_pct") or has("mxu_util_pct"),
             "memory": has("proc_rss_bytes") or has("mem_used_bytes") or has("gpu_mem_used_bytes")}
    return _utilization_section(cpu, memory, x_range, ticks, "step", found, "Per step: the samples' time-weighted "
                                "mean over each step, on the step chart's axis.")


def _sampler_series(analysis, x_of) -> tuple[list[Series], list[Series], dict[str, bool]]:
    """Utilization (%) and memory (GiB) lines from the sampler CSVs, x from `x_of(time_s)`."""
    cpu, memory = [], []
    found = {"machine CPU": False, "process CPU": False, "GPU": False, "memory": False}
    colors = iter(SERIES_COLORS[2:] * 4)
    for name, frame in analysis.samplers.items():
        x = x_of(frame["time_s"].to_numpy(float))
        if "cpu_pct" in frame:
            found["machine CPU"] = True
            cpu.append(Series(f"{name}: machine CPU %", x, frame["cpu_pct"].to_numpy(float), "#1f77b4", hold=True))
        if "proc_cpu_pct" in frame:
            found["process CPU"] = True
            cores = _cores(analysis, frame)
            scale = cores if cores == cores else 1.0
            label = (f"{name}: training process CPU % (of all {cores:g} cores)" if cores == cores
                     else f"{name}: training process CPU % (100 = one core)")
            cpu.append(Series(label, x, frame["proc_cpu_pct"].to_numpy(float) / scale, "#1f77b4", "4 3", hold=True))
        for column, what in (("gpu_util_pct", "GPU utilization %"), ("mxu_util_pct", "TPU matrix units %")):
            if column in frame and frame[column].notna().any():
                found["GPU"] = True
                cpu.append(Series(f"{name}: {what}", x, frame[column].to_numpy(float), next(colors), hold=True))
        if "proc_rss_bytes" in frame:
            found["memory"] = True
            memory.append(Series(f"{name}: training process memory (RSS)", x,
                                 frame["proc_rss_bytes"].to_numpy(float) / 2**30, "#9467bd"))
        if "mem_used_bytes" in frame and frame["mem_used_bytes"].notna().any():
            found["memory"] = True
            is_host = "cpu_pct" in frame
            memory.append(Series(f"{name}: {'machine' if is_host else 'device'} memory used", x,
                                 frame["mem_used_bytes"].to_numpy(float) / 2**30,
                                 "#9467bd" if is_host else next(colors), "4 3" if is_host else ""))
    return cpu, memory, found


def _utilization_over_run(analysis, nested: bool = False) -> str:
    """Sampler lines over the run's wall-clock time, epochs shaded (the steps carry no wall-clock time)."""
    origins = [float(frame["time_s"].min()) for frame in analysis.samplers.values()]
    ends = [float(frame["time_s"].max()) for frame in analysis.samplers.values()]
    bands = []
    if analysis.epochs is not None and len(analysis.epoch_starts_s) == len(analysis.epochs):
        for start, (_, epoch) in zip(analysis.epoch_starts_s, analysis.epochs.iterrows()):
            bands.append((float(start), float(start) + float(epoch["seconds"]), int(epoch["epoch"]),
                          float(epoch["seconds"])))
    origin = min(origins + [b[0] for b in bands])
    end = max(ends + [b[1] for b in bands])

    def x_of(t):
        return np.asarray(t, dtype=float) - origin

    cpu, memory, found = _sampler_series(analysis, x_of)
    span = end - origin
    ticks = [(t, f"{num(t)} s") for t in nice_ticks(span, 8) if t <= span]
    shaded = [Band(s - origin, e - origin, f"epoch {n}", f"epoch {n}: {num(sec)} s") for s, e, n, sec in bands]
    note = ("Over the whole run (seconds since the first sample), epochs shaded; each value is held over the interval "
            "it measured.")
    if not nested:
        note += " The steps above carry no wall-clock time, so the samples are not placed on them."
    return _utilization_section(cpu, memory, (0.0, span or 1.0), ticks, "", found, note, shaded, nested)


def _utilization_section(cpu: list[Series], memory: list[Series], x_range, ticks, x_title: str, found: dict,
                         note: str, bands: Sequence[Band] = (), nested: bool = False) -> str:
    parts = [legend([(s.name, s.color if not s.dash else f"repeating-linear-gradient(90deg,{s.color} 0 4px,#fff 4px 7px)")
                     for s in cpu])]
    if cpu:
        top = max((float(np.nanmax(s.y)) for s in cpu if np.isfinite(s.y).any()), default=100.0)
        parts.append(lines(cpu, "%", "utilization", x_range=x_range, y_max=max(100.0, top), height=190,
                           x_ticks=ticks, x_title=x_title, bands=bands))
    else:
        parts.append(_missing("CPU and GPU utilization: not recorded."))
    if memory:
        parts.append(legend([(s.name, s.color if not s.dash else
                              f"repeating-linear-gradient(90deg,{s.color} 0 4px,#fff 4px 7px)") for s in memory]))
        parts.append(lines(memory, "GiB", "memory", x_range=x_range, height=150, x_ticks=ticks, x_title=x_title,
                           bands=bands))
    else:
        parts.append(_missing("memory: not recorded."))
    if not nested:
        parts.append(_recorded_line(found))
    parts.append(f'<p class="caption">{esc(note)}</p>')
    if nested:
        return "".join(parts)
    return _section("Utilization and memory", *parts, anchor="utilization")


# ---------------------------------------------------------------- findings and tables


def _advice(analysis) -> str:
    """The verdict's advice, then each finding with its evidence and fix."""
    out = []
    advice = analysis.verdict.get("advice") or []
    if advice:
        title = tables.verdict_title(analysis.verdict)
        out.append(f"<h3>For the verdict ({esc(title)})</h3><ul>" + "".join(f"<li>{esc(a)}</li>" for a in advice)
                   + "</ul>")
    if analysis.findings:
        out.append("<h3>Findings</h3>")
    for finding in analysis.findings:
        severity = str(finding.get("severity", ""))
        out.append(f'<div class="finding {esc(severity)}"><span class="sev">{esc(severity)}</span>'
                   f"<b>{esc(finding.get('rule', ''))}</b><p>{esc(finding.get('evidence', ''))}</p>"
                   f"<p><b>Fix:</b> {esc(finding.get('advice', ''))}</p>"
                   + (f"<p><b>Saving:</b> {esc(tables.saving_sentence(finding))} ({esc(finding.get('saving_basis'))})</p>"
                      if tables.saving_sentence(finding) else "") + "</div>")
    if not out:
        out.append("<p>No advice: no rule fired.</p>")
    return _section("Advice and findings", *out, anchor="advice")


def _epochs(analysis) -> str:
    if analysis.epochs is None or analysis.epochs.empty:
        return ""
    epochs = analysis.epochs
    parts = [("input_s", PART_COLORS["input"], "input"), ("call_s", PART_COLORS["compute"], "step call"),
             ("other_host_s", PART_COLORS["host"], "other host"),
             ("epoch_level_s", EPOCH_LEVEL_COLOR, "outside steps (validation, iterator setup, ...)")]
    bars = []
    for _, row in epochs.iterrows():
        split = " + ".join(f"{name} {num(float(row[col]))}" for col, _, name in parts)
        bars.append(Bar(tuple(float(row[col]) for col, _, _ in parts),
                        f"epoch {int(row['epoch'])}: {num(float(row['seconds']))} s = {split}", str(int(row["epoch"]))))
    if len(bars) > MAX_BARS:  # runs of thousands of epochs: consecutive ones share a bar
        per_bar = math.ceil(len(bars) / MAX_BARS)
        bars = [Bar(tuple(float(np.mean(v)) for v in zip(*(b.values for b in bars[i:i + per_bar]))),
                    f"epochs {bars[i].label}-{bars[min(i + per_bar, len(bars)) - 1].label} (mean)", bars[i].label)
                for i in range(0, len(bars), per_bar)]
    svg, _ = stacked_bars(bars, [(c, color) for _, color, c in parts], "s", "epoch time by part",
                          height=240, x_title="epoch", cap_outliers=False)
    return _section("Epochs", legend([(name, color) for _, color, name in parts]), svg,
                    '<p class="caption">From steps.csv and run.json: each epoch\'s wall time, with the work outside '
                    "training steps as its own part.</p>", _table(tables.epochs_table(analysis)), anchor="epochs")


def _devices(analysis) -> str:
    if analysis.devices.empty:
        return ""
    recorded = tables.devices_table(analysis, recorded_only=True)
    missing = analysis.devices.loc[~analysis.devices["recorded"].astype(bool), "device"].tolist() \
        if "recorded" in analysis.devices else []
    out = ['<p class="caption">Each device\'s own steps (its work grouped by the trace, not cut at the host\'s '
           "step boundaries): mean ms over the steady steps it ran in; idle split into waiting for input and the "
           "rest.</p>", _table(recorded, name_columns=("device",)) if not recorded.empty else ""]
    if missing:
        out.append(f'<p class="caption notrecorded">Not recorded (no events; unknown, not idle): '
                   f"{esc(', '.join(missing))}.</p>")
    launch = analysis.kernel_launch
    if launch and launch.get("calls"):
        out.append(f'<p class="caption">Kernel launches on the host: {launch["calls"]:,} calls, '
                   f"{launch['calls_per_step']:.1f} per step, {launch['ms_per_step']:.3f} ms per step.</p>")
    return _section("Devices", *out, anchor="devices")


def _workers(analysis) -> str:
    if analysis.workers.empty:
        return ""
    straggler = analysis.straggler
    worker = str(straggler["worker"]) if straggler else None
    line = tables.straggler_line(analysis)
    summary = "".join(f'<p class="caption">{esc(text)}</p>' for text in tables.worker_summary_lines(analysis))
    return _section("Workers", '<p class="caption">Mean ms per steady step of each worker.</p>',
                    _table(tables.workers_table(analysis), highlight=lambda row: str(row["worker"]) == worker),
                    f"<p><b>{esc(line)}</b></p>" if line else "", summary, _worker_heat_map(analysis),
                    anchor="workers")


MARK_SCORE = 0.1  # the heat map outlines workers whose straggler score is at least this (10 % slower, or spikier)


def _worker_heat_map(analysis) -> str:
    steps = analysis.worker_steps
    if steps is None or steps.empty or len(analysis.workers) < 2:
        return ""
    grid = steps.pivot_table(index="worker", columns="step", values="own_ms", aggfunc="mean", sort=True)
    names = [str(w) for w in grid.index]
    marked = {}
    straggler = str(analysis.straggler["worker"]) if analysis.straggler else None
    for item in analysis.slowest_workers:
        name = str(item["worker"])
        score = item["straggler_score"]
        if name in names and (name == straggler or (score is not None and score >= MARK_SCORE)):
            marked[names.index(name)] = (f"{'straggler ' if name == straggler else ''}{name}: "
                                         f"{item['cause'] or '-'}, score {score:.2f}")
    chart = heat_map(grid.to_numpy(dtype=float), names, [str(c) for c in grid.columns], marked, "ms",
                            "step time without collective wait, per worker and step")
    return ('<p class="caption">Step time without collective wait, per worker (rows) and step (columns); '
            f"outlined: the straggler and workers scoring {MARK_SCORE:g} or more.</p>" + chart)


MEMORY_STEPS_SHOWN = 12  # steps whose peak and held bytes a caption lists; the JSON has every one


def _live_frame(groups, total: float) -> pd.DataFrame:
    """Groups of live allocations as table rows, with their share of `total` bytes."""
    return pd.DataFrame([{"op": item.op or f"({item.unnamed})",
                          "tensor": " ".join(part for part in (item.shape, item.dtype) if part)
                          + (f" x{item.count}" if item.count and item.count > 1 else ""),
                          "region": item.region if item.in_window else "", "size": tables.size(item.bytes),
                          "%": f"{100 * item.bytes / total:.1f}" if total > 0 else "-"} for item in groups])


def _oom(memory) -> str:
    """The out-of-memory error that ended the run: the allocation that failed and what held the memory."""
    failure = memory.oom
    if failure is None:
        return ""
    held = tables.oom_held(failure)
    table = ""
    if failure.top:
        table = ('<p class="caption">Live then, the largest first:</p>'
                 + _table(_live_frame(failure.top, failure.held_bytes), name_columns=("op",), right=("size", "%")))
    return (f'<div class="oom"><h3>Out of memory: the run ended here</h3><p>The run failed '
            f"{esc(tables.oom_allocation(failure))}.</p><p>{esc(held[:1].upper() + held[1:])}.</p>{table}</div>")


def _memory(analysis) -> str:
    """Each allocator's bytes in use over the traced window (steps shaded, the peak marked) beside the
    table of what was live at the peak; the sampled memory of the run in a line; first, the
    out-of-memory error that ended the run, if one did."""
    memory = analysis.memory
    if memory is None:
        return ""
    out = [_oom(memory)]
    if not memory.allocators:
        out.append(_missing("Allocators: not recorded (the trace holds no MemoryAllocation events)."))
    for peak in memory.allocators:
        events = memory.timeline[memory.timeline["allocator"] == peak.name]
        steps = memory.steps[memory.steps["allocator"] == peak.name]
        bands = [Band(float(s.start_ms), float(s.end_ms), f"step {s.step}",
                      f"step {s.step}: peak {tables.size(s.peak_bytes)}, {tables.size(s.end_bytes)} held at its end")
                 for s in steps.itertuples(index=False)]
        held = "; ".join(f"{tables.live_name(live)}: {tables.size(live.bytes)}" for live in peak.top_at_peak[:3])
        chart = memory_timeline(events["time_ms"].to_numpy(dtype=float), events["bytes_in_use"].to_numpy(dtype=float),
                                bands, (peak.peak_time_ms, float(peak.peak_bytes), f"{tables.peak_sentence(peak)}. {held}"),
                                f"{peak.name}: bytes in use over the traced window", capacity=peak.capacity_bytes)
        live = _live_frame(peak.top_at_peak, peak.peak_bytes)
        ends = ", ".join(f"{tables.size(v)}" for v in steps["end_bytes"].head(MEMORY_STEPS_SHOWN))
        more = "" if len(steps) <= MEMORY_STEPS_SHOWN else f" (first {MEMORY_STEPS_SHOWN} of {len(steps)})"
        growth = (f" Held at step end grows {tables.size(peak.growth_bytes_per_step)} a step."
                  if peak.growth_bytes_per_step == peak.growth_bytes_per_step else "")
        out.append(f"<h3>{esc(peak.name)}</h3>"
                   f'<p class="caption">{esc(tables.peak_sentence(peak))}. '
                   f"{esc(tables.headroom_sentence(peak, memory.batch_size))}.</p>"
                   f'<div class="memrow"><div>{chart}'
                   + (f'<p class="caption">Held at each step\'s end{esc(more)}: {esc(ends)}.{esc(growth)}</p>'
                      if ends else "")
                   + f"</div><div><p class=\"caption\">Live at the peak, the largest first:</p>"
                   f"{_table(live, name_columns=('op',), right=('size', '%'))}</div></div>")
    if memory.workers:
        out.append(f"<h3>Every worker</h3><p class=\"caption\">The allocators above are "
                   f"{esc(tables.worker_name(memory.workers[0].worker))}'s; each worker's peaks:</p><ul>"
                   + "".join(f"<li>{esc(line)}</li>" for line in tables.worker_memory_lines(memory)) + "</ul>")
    out += [f'<p class="caption">{esc(line[0].upper() + line[1:])}.</p>' for line in tables.sampled_memory_lines(memory)]
    return _section("Memory", '<p class="caption">From the allocators\' own events in the trace (every event in '
                    "memory.csv): bytes in use after each allocation and deallocation, the steps shaded, the peak "
                    "marked (hover it for what held it).</p>", *out, anchor="memory")


# The roofline columns of the op table (analysis/breakdown/roofline.py): four shown in the table, the rest in the
# chart's tooltips.
ROOF_TABLE = {"flops_per_second": "FLOP/s", "intensity": "FLOP/byte", "bound": "bound", "ceiling_pct": "% of ceiling"}
ROOF_HIDDEN = ("dtype", "kind", "kernel", "flops_per_step", "bytes_per_step", "bytes_per_second")
LABELLED_OPS = 5  # ops named on the chart: the most time at the lowest share of their ceiling
LABEL_CHARS, LABEL_CONTEXT = 36, 200  # a label's length, and how many of the busiest ops it is told apart from
CEILING_HOW = ("measure them with `devprof peak` before the run (or `devprof run --measure-peak`), or give them to "
               "`devprof analyze --peak-tflops` or `--peak-file`")


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
    return _section("Top ops", f'<p class="caption">The {len(shown)} slowest of {len(analysis.ops):,} ops, ms per '
                    "training step and share of op time (all of them in ops.csv)"
                    + ("; FLOP/s achieved, FLOPs per byte, what bounds the op and its share of that ceiling where "
                       "its costs are known" if known else "") + ".</p>",
                    _table(table, name_columns=("op", "type", "device"),
                           right=[ROOF_TABLE[c] for c in known if c != "bound"]), anchor="ops")


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

        roof = Roof("any dtype" if dtype == "*" else str(dtype), value("matrix_flops_per_second"), value("vector_flops_per_second"),
                    value("memory_bytes_per_second"))
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
    notes = [str(n) for n in [info.get("note"), *(info.get("notes") or [])]
             if isinstance(n, str) and n and not n.startswith("no op costs") and "ceilings unknown" not in n]
    note = "".join(f'<p class="caption">{esc(n[:1].upper() + n[1:])}.</p>' for n in notes)
    drawn = _roof_points(ops)
    if drawn.empty:
        costed = [c for c in ("flops_per_step", "bytes_per_step") if c in ops]
        known = len(costed) == 2 and bool((_known(ops["flops_per_step"]) & _known(ops["bytes_per_step"])).any())
        why = ("the ops with known FLOPs and bytes do no arithmetic" if known else
               "no traced op has known FLOPs and bytes (they come from the run's op_costs.csv, recorded at capture, "
               "or from HLO shapes in the trace, and neither gave any)")
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
    unknown = [u for u in unknown if u.split(" ")[0] in ("*", "any") or (
        "float" in u.split(" ")[0] and time_by_dtype is not None and total_ms > 0
        and float(time_by_dtype.get(u.split(" ")[0], 0.0)) >= MIN_WARNED_SHARE * total_ms)]
    ms = drawn["ms_per_step"].to_numpy(dtype=float)
    pct = drawn["ceiling_pct"].to_numpy(dtype=float) if "ceiling_pct" in drawn else np.full(len(drawn), np.nan)
    # Most time at the lowest share of its ceiling (without ceilings: most time).
    score = np.where(np.isfinite(pct), ms * (1 - np.clip(pct, 0, 100) / 100), ms)
    order = [i for i in np.argsort(-score, kind="stable")[:LABELLED_OPS] if score[i] > 0]
    # Shortened against the busiest ops around them, so that a label still tells its op from its neighbours'.
    context = list(dict.fromkeys([*order, *range(min(len(drawn), LABEL_CONTEXT))]))
    full = [f"{p}/{o}" if isinstance(p, str) and p else str(o)  # XLA's op names repeat across programs
            for p, o in zip(drawn["program"] if "program" in drawn else [""] * len(drawn), drawn["op"])]
    names = distinct_names([full[i] for i in context], LABEL_CHARS)
    labels = dict(zip(order, names))
    points = []
    for i, (_, row) in enumerate(drawn.iterrows()):
        kind = _text(row, "kind")
        ceiling = " ".join(w for w in ("of its", _text(row, "dtype"), kind, "ceiling") if w)
        share = f"{pct[i]:.1f} % {ceiling}" if math.isfinite(pct[i]) else "ceiling unknown"
        bound = _text(row, "bound")
        time = f"{num(float(row['ms_per_step']))} ms per step"
        details = [full[i] + (f" ({row['type']})" if _text(row, "type") else ""),
                   f"{si(float(row['flops_per_second']), 'FLOP/s')} at {num(float(row['intensity']))} FLOP/byte",
                   share + (f", {bound}-bound" if bound else ""), time]
        if _text(row, "kernel"):
            details.append(f"kernel {row['kernel']}")
        points.append(RoofPoint(float(row["intensity"]), float(row["flops_per_second"]), float(row["ms_per_step"]),
                                kind if kind in KIND_COLORS else "", "\n".join(details), labels.get(i, ""),
                                f": {time}, {share}"))
    # The labelled ops first, the least efficient first: the chart numbers them in this order.
    points = [points[i] for i in order] + [p for i, p in enumerate(points) if i not in labels]
    svg = roofline(points, roofs, "roofline: achieved FLOP/s against arithmetic intensity per op")
    kinds = {p.kind for p in points}
    known = any(v == v for r in roofs for v in (r.matrix, r.vector, r.bandwidth))  # any ceiling drawn
    roof = " and their roof" if known else ""
    keys = [(name, KIND_COLORS[kind]) for kind, name in (
        ("matrix", f"matrix ops (convolutions, matmuls){roof}"), ("vector", f"vector ops{roof}"),
        ("", "ops of unknown kind")) if kind in kinds]
    if any(r.bandwidth == r.bandwidth for r in roofs):
        keys.append(("memory bandwidth", MEMORY_COLOR))
    styles = ["solid", "dashed", "dotted", "dash-dot"]
    extra = (f'<span class="key">lines: {esc(", ".join(f"{r.dtype} {styles[k % 4]}" for k, r in enumerate(roofs)))}'
             "</span>") if len(roofs) > 1 and known else ""
    source = info.get("ceilings_source")
    sentences = [f"Each circle is an op with known FLOPs and bytes, its area its time per step ({total:,} of "
                 f"{len(ops):,} ops"
                 + (f", {float(info['known_time_pct']):.1f} % of op time" if _is_number(info.get("known_time_pct"))
                    else "") + ")" + (f"; the {MAX_ROOF_POINTS:,} slowest are drawn" if total > MAX_ROOF_POINTS
                                      else "")
                 + "." + (" An op is bound by the lower of its roofs: the memory slope or its flat ceiling." if known
                          else "") + " Numbered: the ops with the most time at the lowest share of their ceiling."]
    if known:
        sentences.append(f"Ceilings from {source}." if isinstance(source, str) and source else "")
    flops, model = _number(info.get("flops_per_step")), _number(info.get("model_flops_per_step"))
    achieved, mfu = _number(info.get("achieved_flops_per_second")), _number(info.get("mfu_pct"))
    if flops == flops:
        sentences.append(f"FLOPs per step: {si(flops, 'FLOP')}" + (f" (model: {si(model, 'FLOP')})" if model == model
                                                                     else "")
                         + (f", {si(achieved, 'FLOP/s')} achieved {info.get('achieved_over') or ''}".rstrip()
                            if achieved == achieved else "")
                         + (f", MFU {mfu:.1f} % of the {info.get('dtype') or ''} matrix ceiling over the same ops"
                            .replace("  ", " ") if mfu == mfu else "") + ".")
    caption = f'<p class="caption">{esc(" ".join(s for s in sentences if s))}</p>'
    if not known:
        warning = _missing(f"The ceilings are unknown, so only the ops are drawn: {CEILING_HOW}.")
    elif unknown:
        warning = _missing(f"Unknown ceilings ({', '.join(unknown)}): {CEILING_HOW}.")
    else:
        warning = ""
    return _section("Roofline", legend(keys, extra), svg, caption, warning, note, anchor="roofline")


def _stages(analysis) -> str:
    if analysis.input_stages.empty:
        return ""
    shown = analysis.input_stages.head(tables.TOP_OPS)
    bottleneck = analysis.input_bottleneck
    extra = (f"<p><b>Input bottleneck:</b> {esc(bottleneck['stage'])} ({bottleneck['ms_per_batch']:.3f} ms per "
             "batch)</p>") if bottleneck else ""
    return _section("tf.data stages", '<p class="caption">Self time per batch, slowest first.</p>',
                    _table(shown, name_columns=("stage",)), extra, anchor="input")


def _flat(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _run_info(analysis) -> str:
    run = analysis.run or {}
    if not run:
        facts = {"trace": str(analysis.path), "host": analysis.host, "written by": analysis.producer,
                 "device": analysis.device}
        return _section("Run", '<div class="kv">' + _key_values("Trace", facts) + "</div>",
                        '<p class="caption">No run.json: a trace on its own has no recorded config.</p>', anchor="run")
    status = {k: run.get(k) for k in ("status", "error", "started_at", "finished_at", "devprof_version")
              if k in run}
    blocks = [_key_values("Status", status)]
    for key, title in (("device", "Device"), ("config", "Config"), ("model", "Model"), ("data", "Data"),
                       ("versions", "Versions"), ("profiler", "Profiler")):
        value = run.get(key)
        if isinstance(value, dict):
            blocks.append(_key_values(title, _flat(value)))
    return _section("Run", '<div class="kv">' + "".join(blocks) + "</div>", anchor="run")


# ---------------------------------------------------------------- compare


def render_comparison(comparison) -> str:
    table = comparison.table
    collective = bool((table["collective_pct"].fillna(0) > 0).any())
    names = ("input", "compute", "collective", "host", "epoch_level") if collective else (
        "input", "compute", "host", "epoch_level")
    colors = [(n, PART_COLORS.get(n, EPOCH_LEVEL_COLOR)) for n in names]
    labels = {"input": "input", "compute": "compute", "collective": "collective wait", "host": "host overhead",
              "epoch_level": "outside steps (validation, setup)"}
    # Runs that train different numbers of images per epoch are drawn per image, as compare's chart does.
    per_image = table["images_per_epoch"].nunique(dropna=True) > 1
    unit, short = ("ms per image", "ms") if per_image else ("seconds per epoch", "s")
    rows = []
    for _, row in table.iterrows():
        if per_image:
            values = tuple(float(row[f"{n}_ms_per_image"]) for n in names)
            total = 1000.0 * float(row["seconds_per_epoch"]) / float(row["images_per_epoch"])
        else:
            values = tuple(float(row[f"{n}_s"]) for n in names)
            total = float(row["seconds_per_epoch"])
        name = f"{row['run']}{' (external)' if row['external'] else ''}{' *' if row['baseline'] else ''}"
        split = " + ".join(f"{labels[n]} {num(v)}" for n, v in zip(names, values) if v == v)
        rows.append((name, values, f"{name} ({row['device']}): {num(total)} {short}" + (f" = {split}" if split else ""),
                     total))
    svg = hbars(rows, colors, unit, "time per epoch by part")
    why = "".join(f"<li>{esc(line)}</li>" for line in table["why"])
    workers = []
    for _, row in table.iterrows():
        for worker in row.get("workers") or []:
            workers.append(f"<li>{esc(row['run'])} / {esc(worker['run'])}: {worker['seconds_per_epoch']:.3g} s/epoch, "
                           f"{esc(tables.worker_parts(worker))}</li>")
    notes = tables.external_notes(table)
    body = [
        f"<header><h1>devprof compare: {len(table)} runs</h1><ul class=\"meta\"><li>baseline (*): "
        f"{esc(comparison.baseline)}</li><li>fastest: {esc(comparison.fastest)}</li></ul></header>",
        _section(f"Time per epoch ({unit}, steady epochs)", legend([(labels[n], c) for n, c in colors]), svg,
                 '<p class="caption">Each run\'s steady epoch (the median of the epochs after the first) split into '
                 f"input, compute,{' collective wait,' if collective else ''} host overhead and work outside steps.</p>",
                 anchor="chart"),
        _section("Runs", _table(tables.compare_display_frame(table), name_columns=("run", "device")),
                 '<p class="caption">* baseline; % columns are shares of the epoch (epoch% = validation and other '
                 "work outside training steps).</p>", anchor="runs"),
        _section("Why", f"<ul>{why}</ul>", anchor="why"),
        _section("Workers", f"<ul>{''.join(workers)}</ul>") if workers else "",
        _section("External timings", "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>") if notes else "",
        _section("Warnings", "<ul>" + "".join(f"<li>{esc(w.removeprefix('warning: '))}</li>"
                                               for w in comparison.warnings) + "</ul>") if comparison.warnings else "",
    ]
    if comparison.op_diff is not None:
        lines_ = tables.op_diff_lines(comparison)
        body.append(_section("Op diff", f"<p>{esc(lines_[0])}</p><ul>"
                             + "".join(f"<li>{esc(line.strip().removeprefix('- '))}</li>" for line in lines_[1:])
                             + "</ul>", anchor="ops"))
    return _page("devprof compare", body)
