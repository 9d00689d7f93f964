"""One self-contained HTML page: `--format html`, `-o report.html` and `analysis/report.html`.

No network: no script, no web font, no external style sheet or image; the charts are inline
SVG (`html_charts`) and a Content-Security-Policy meta tag forbids the page to load anything,
so a copied report opens the same on an air-gapped machine. Hover details are SVG `<title>`
tooltips (no JavaScript). Every text from a trace, run.json or a run name is escaped. Like
every format, a pure function of the `Analysis` or `Comparison`: it selects, formats and
bins for drawing, never analyses. The page and its tables are `html_page`'s, the utilization
lines `html_utilization`'s, the op table and the roofline `html_roofline`'s.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.render import tables
from analysis.render.html_charts import (
    EPOCH_LEVEL_COLOR,
    MAX_BARS,
    OUTLIER_COLOR,
    PART_COLORS,
    Band,
    Bar,
    esc,
    hbars,
    heat_map,
    legend,
    num,
    stacked_bars,
)
from analysis.render.html_memory_chart import memory_timeline
from analysis.render.html_page import _key_values, _missing, _page, _section, _step_bins, _table
from analysis.render.html_roofline import _ops, _roofline
from analysis.render.html_utilization import _utilization

STEP_PARTS = ("input", "compute", "collective", "host")
COMPILE_KEY = "repeating-linear-gradient(45deg,#000 0 1.5px,#fff 1.5px 4px)"


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
        '<ul class="meta">' + "".join(f"<li>{esc(line)}</li>" for line in tables.header_lines(analysis)) + "</ul>"
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
    saving = "".join(
        f'<p class="saving">{esc(line[0].upper() + line[1:])}</p>' for line in tables.verdict_saving_lines(verdict)
    )
    return (
        f'<div class="verdict {esc(bound)}" id="verdict"><h2>Verdict: {esc(tables.verdict_title(verdict))}</h2>'
        f"<p>{esc(verdict.get('evidence', ''))}{more}</p>{saving}</div>"
    )


def _step_parts(steps: pd.DataFrame) -> list[str]:
    return [p for p in STEP_PARTS if f"{p}_ms" in steps and (p != "collective" or (steps[f"{p}_ms"] > 0).any())]


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
    svg, cut = stacked_bars(
        bars,
        [(p, PART_COLORS[p]) for p in parts],
        "ms",
        "step time by part",
        hatch_after=parts.index("host"),
        x_title="call" if noun == "calls" else "step",
        marked=_outlier_bars(analysis, per_bar),
        median=spread["median_ms"] if spread else None,
    )
    keys = [
        (f"{p}" + (" overhead" if p == "host" else " wait" if p == "collective" else ""), PART_COLORS[p]) for p in parts
    ]
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

    caption = (
        f'<p class="caption">{counted(len(steps))}; mean over {counted(analysis.steps_used, "steady ")}: '
        f"{mean.get('step_ms', 0.0):.2f} ms = {esc(split)}."
        + ("<br>" + esc("; ".join(notes)) if notes else "")
        + "</p>"
    )
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
        texts.append(
            f"{noun} {o['step']}: {num(o['step_ms'])} ms ({o['step_ms'] / median:.1f}x the median), "
            f"{CAUSE_WORDS.get(o['cause'], o['cause'])} {'+' if o['excess_ms'] >= 0 else ''}"
            f"{tables.short_ms(o['excess_ms'], 2)} ms"
        )
    return {
        bar: f"over 1.5x the median (median {num(median)} ms): "
        + "; ".join(texts[:OUTLIERS_PER_BAR])
        + (f"; {len(texts) - OUTLIERS_PER_BAR} more" if len(texts) > OUTLIERS_PER_BAR else "")
        for bar, texts in named.items()
    }


# ---------------------------------------------------------------- findings and tables


def _advice(analysis) -> str:
    """The verdict's advice, then each finding with its evidence and fix."""
    out = []
    advice = analysis.verdict.get("advice") or []
    if advice:
        title = tables.verdict_title(analysis.verdict)
        out.append(
            f"<h3>For the verdict ({esc(title)})</h3><ul>" + "".join(f"<li>{esc(a)}</li>" for a in advice) + "</ul>"
        )
    if analysis.findings:
        out.append("<h3>Findings</h3>")
    for finding in analysis.findings:
        severity = str(finding.get("severity", ""))
        out.append(
            f'<div class="finding {esc(severity)}"><span class="sev">{esc(severity)}</span>'
            f"<b>{esc(finding.get('rule', ''))}</b><p>{esc(finding.get('evidence', ''))}</p>"
            f"<p><b>Fix:</b> {esc(finding.get('advice', ''))}</p>"
            + (
                f"<p><b>Saving:</b> {esc(tables.saving_sentence(finding))} ({esc(finding.get('saving_basis'))})</p>"
                if tables.saving_sentence(finding)
                else ""
            )
            + "</div>"
        )
    if not out:
        out.append("<p>No advice: no rule fired.</p>")
    return _section("Advice and findings", *out, anchor="advice")


def _epochs(analysis) -> str:
    if analysis.epochs is None or analysis.epochs.empty:
        return ""
    epochs = analysis.epochs
    parts = [
        ("input_s", PART_COLORS["input"], "input"),
        ("call_s", PART_COLORS["compute"], "step call"),
        ("other_host_s", PART_COLORS["host"], "other host"),
        ("epoch_level_s", EPOCH_LEVEL_COLOR, "outside steps (validation, iterator setup, ...)"),
    ]
    bars = []
    for _, row in epochs.iterrows():
        split = " + ".join(f"{name} {num(float(row[col]))}" for col, _, name in parts)
        bars.append(
            Bar(
                tuple(float(row[col]) for col, _, _ in parts),
                f"epoch {int(row['epoch'])}: {num(float(row['seconds']))} s = {split}",
                str(int(row["epoch"])),
            )
        )
    if len(bars) > MAX_BARS:  # runs of thousands of epochs: consecutive ones share a bar
        per_bar = math.ceil(len(bars) / MAX_BARS)
        bars = [
            Bar(
                tuple(float(np.mean(v)) for v in zip(*(b.values for b in bars[i : i + per_bar]))),
                f"epochs {bars[i].label}-{bars[min(i + per_bar, len(bars)) - 1].label} (mean)",
                bars[i].label,
            )
            for i in range(0, len(bars), per_bar)
        ]
    svg, _ = stacked_bars(
        bars,
        [(c, color) for _, color, c in parts],
        "s",
        "epoch time by part",
        height=240,
        x_title="epoch",
        cap_outliers=False,
    )
    return _section(
        "Epochs",
        legend([(name, color) for _, color, name in parts]),
        svg,
        '<p class="caption">From steps.csv and run.json: each epoch\'s wall time, with the work outside '
        "training steps as its own part.</p>",
        _table(tables.epochs_table(analysis)),
        anchor="epochs",
    )


def _devices(analysis) -> str:
    if analysis.devices.empty:
        return ""
    recorded = tables.devices_table(analysis, recorded_only=True)
    missing = (
        analysis.devices.loc[~analysis.devices["recorded"].astype(bool), "device"].tolist()
        if "recorded" in analysis.devices
        else []
    )
    out = [
        "<p class=\"caption\">Each device's own steps (its work grouped by the trace, not cut at the host's "
        "step boundaries): mean ms over the steady steps it ran in; idle split into waiting for input and the "
        "rest.</p>",
        _table(recorded, name_columns=("device",)) if not recorded.empty else "",
    ]
    if missing:
        out.append(
            f'<p class="caption notrecorded">Not recorded (no events; unknown, not idle): '
            f"{esc(', '.join(missing))}.</p>"
        )
    launch = analysis.kernel_launch
    if launch and launch.get("calls"):
        out.append(
            f'<p class="caption">Kernel launches on the host: {launch["calls"]:,} calls, '
            f"{launch['calls_per_step']:.1f} per step, {launch['ms_per_step']:.3f} ms per step.</p>"
        )
    return _section("Devices", *out, anchor="devices")


def _workers(analysis) -> str:
    if analysis.workers.empty:
        return ""
    straggler = analysis.straggler
    worker = str(straggler["worker"]) if straggler else None
    line = tables.straggler_line(analysis)
    summary = "".join(f'<p class="caption">{esc(text)}</p>' for text in tables.worker_summary_lines(analysis))
    return _section(
        "Workers",
        '<p class="caption">Mean ms per steady step of each worker.</p>',
        _table(tables.workers_table(analysis), highlight=lambda row: str(row["worker"]) == worker),
        f"<p><b>{esc(line)}</b></p>" if line else "",
        summary,
        _worker_heat_map(analysis),
        anchor="workers",
    )


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
            marked[names.index(name)] = (
                f"{'straggler ' if name == straggler else ''}{name}: {item['cause'] or '-'}, score {score:.2f}"
            )
    chart = heat_map(
        grid.to_numpy(dtype=float),
        names,
        [str(c) for c in grid.columns],
        marked,
        "ms",
        "step time without collective wait, per worker and step",
    )
    return (
        '<p class="caption">Step time without collective wait, per worker (rows) and step (columns); '
        f"outlined: the straggler and workers scoring {MARK_SCORE:g} or more.</p>" + chart
    )


MEMORY_STEPS_SHOWN = 12  # steps whose peak and held bytes a caption lists; the JSON has every one


def _live_frame(groups, total: float) -> pd.DataFrame:
    """Groups of live allocations as table rows, with their share of `total` bytes."""
    return pd.DataFrame(
        [
            {
                "op": item.op or f"({item.unnamed})",
                "tensor": " ".join(part for part in (item.shape, item.dtype) if part)
                + (f" x{item.count}" if item.count and item.count > 1 else ""),
                "region": item.region if item.in_window else "",
                "size": tables.size(item.bytes),
                "%": f"{100 * item.bytes / total:.1f}" if total > 0 else "-",
            }
            for item in groups
        ]
    )


def _oom(memory) -> str:
    """The out-of-memory error that ended the run: the allocation that failed and what held the memory."""
    failure = memory.oom
    if failure is None:
        return ""
    held = tables.oom_held(failure)
    table = ""
    if failure.top:
        table = '<p class="caption">Live then, the largest first:</p>' + _table(
            _live_frame(failure.top, failure.held_bytes), name_columns=("op",), right=("size", "%")
        )
    return (
        f'<div class="oom"><h3>Out of memory: the run ended here</h3><p>The run failed '
        f"{esc(tables.oom_allocation(failure))}.</p><p>{esc(held[:1].upper() + held[1:])}.</p>{table}</div>"
    )


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
        bands = [
            Band(
                float(s.start_ms),
                float(s.end_ms),
                f"step {s.step}",
                f"step {s.step}: peak {tables.size(s.peak_bytes)}, {tables.size(s.end_bytes)} held at its end",
            )
            for s in steps.itertuples(index=False)
        ]
        held = "; ".join(f"{tables.live_name(live)}: {tables.size(live.bytes)}" for live in peak.top_at_peak[:3])
        chart = memory_timeline(
            events["time_ms"].to_numpy(dtype=float),
            events["bytes_in_use"].to_numpy(dtype=float),
            bands,
            (peak.peak_time_ms, float(peak.peak_bytes), f"{tables.peak_sentence(peak)}. {held}"),
            f"{peak.name}: bytes in use over the traced window",
            capacity=peak.capacity_bytes,
        )
        live = _live_frame(peak.top_at_peak, peak.peak_bytes)
        ends = ", ".join(f"{tables.size(v)}" for v in steps["end_bytes"].head(MEMORY_STEPS_SHOWN))
        more = "" if len(steps) <= MEMORY_STEPS_SHOWN else f" (first {MEMORY_STEPS_SHOWN} of {len(steps)})"
        growth = (
            f" Held at step end grows {tables.size(peak.growth_bytes_per_step)} a step."
            if peak.growth_bytes_per_step == peak.growth_bytes_per_step
            else ""
        )
        out.append(
            f"<h3>{esc(peak.name)}</h3>"
            f'<p class="caption">{esc(tables.peak_sentence(peak))}. '
            f"{esc(tables.headroom_sentence(peak, memory.batch_size))}.</p>"
            f'<div class="memrow"><div>{chart}'
            + (f'<p class="caption">Held at each step\'s end{esc(more)}: {esc(ends)}.{esc(growth)}</p>' if ends else "")
            + f'</div><div><p class="caption">Live at the peak, the largest first:</p>'
            f"{_table(live, name_columns=('op',), right=('size', '%'))}</div></div>"
        )
    if memory.workers:
        out.append(
            f'<h3>Every worker</h3><p class="caption">The allocators above are '
            f"{esc(tables.worker_name(memory.workers[0].worker))}'s; each worker's peaks:</p><ul>"
            + "".join(f"<li>{esc(line)}</li>" for line in tables.worker_memory_lines(memory))
            + "</ul>"
        )
    out += [
        f'<p class="caption">{esc(line[0].upper() + line[1:])}.</p>' for line in tables.sampled_memory_lines(memory)
    ]
    return _section(
        "Memory",
        '<p class="caption">From the allocators\' own events in the trace (every event in '
        "memory.csv): bytes in use after each allocation and deallocation, the steps shaded, the peak "
        "marked (hover it for what held it).</p>",
        *out,
        anchor="memory",
    )


def _stages(analysis) -> str:
    if analysis.input_stages.empty:
        return ""
    shown = analysis.input_stages.head(tables.TOP_OPS)
    bottleneck = analysis.input_bottleneck
    extra = (
        (f"<p><b>Input bottleneck:</b> {esc(bottleneck['stage'])} ({bottleneck['ms_per_batch']:.3f} ms per batch)</p>")
        if bottleneck
        else ""
    )
    return _section(
        "tf.data stages",
        '<p class="caption">Self time per batch, slowest first.</p>',
        _table(shown, name_columns=("stage",)),
        extra,
        anchor="input",
    )


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
        facts = {
            "trace": str(analysis.path),
            "host": analysis.host,
            "written by": analysis.producer,
            "device": analysis.device,
        }
        return _section(
            "Run",
            '<div class="kv">' + _key_values("Trace", facts) + "</div>",
            '<p class="caption">No run.json: a trace on its own has no recorded config.</p>',
            anchor="run",
        )
    status = {k: run.get(k) for k in ("status", "error", "started_at", "finished_at", "devprof_version") if k in run}
    blocks = [_key_values("Status", status)]
    for key, title in (
        ("device", "Device"),
        ("config", "Config"),
        ("model", "Model"),
        ("data", "Data"),
        ("versions", "Versions"),
        ("profiler", "Profiler"),
    ):
        value = run.get(key)
        if isinstance(value, dict):
            blocks.append(_key_values(title, _flat(value)))
    return _section("Run", '<div class="kv">' + "".join(blocks) + "</div>", anchor="run")


# ---------------------------------------------------------------- compare


def render_comparison(comparison) -> str:
    table = comparison.table
    collective = bool((table["collective_pct"].fillna(0) > 0).any())
    names = (
        ("input", "compute", "collective", "host", "epoch_level")
        if collective
        else ("input", "compute", "host", "epoch_level")
    )
    colors = [(n, PART_COLORS.get(n, EPOCH_LEVEL_COLOR)) for n in names]
    labels = {
        "input": "input",
        "compute": "compute",
        "collective": "collective wait",
        "host": "host overhead",
        "epoch_level": "outside steps (validation, setup)",
    }
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
        rows.append(
            (name, values, f"{name} ({row['device']}): {num(total)} {short}" + (f" = {split}" if split else ""), total)
        )
    svg = hbars(rows, colors, unit, "time per epoch by part")
    why = "".join(f"<li>{esc(line)}</li>" for line in table["why"])
    workers = []
    for _, row in table.iterrows():
        for worker in row.get("workers") or []:
            workers.append(
                f"<li>{esc(row['run'])} / {esc(worker['run'])}: {worker['seconds_per_epoch']:.3g} s/epoch, "
                f"{esc(tables.worker_parts(worker))}</li>"
            )
    notes = tables.external_notes(table)
    body = [
        f'<header><h1>devprof compare: {len(table)} runs</h1><ul class="meta"><li>baseline (*): '
        f"{esc(comparison.baseline)}</li><li>fastest: {esc(comparison.fastest)}</li></ul></header>",
        _section(
            f"Time per epoch ({unit}, steady epochs)",
            legend([(labels[n], c) for n, c in colors]),
            svg,
            '<p class="caption">Each run\'s steady epoch (the median of the epochs after the first) split into '
            f"input, compute,{' collective wait,' if collective else ''} host overhead and work outside steps.</p>",
            anchor="chart",
        ),
        _section(
            "Runs",
            _table(tables.compare_display_frame(table), name_columns=("run", "device")),
            '<p class="caption">* baseline; % columns are shares of the epoch (epoch% = validation and other '
            "work outside training steps).</p>",
            anchor="runs",
        ),
        _section("Why", f"<ul>{why}</ul>", anchor="why"),
        _section("Workers", f"<ul>{''.join(workers)}</ul>") if workers else "",
        _section("External timings", "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>") if notes else "",
        _section(
            "Warnings",
            "<ul>" + "".join(f"<li>{esc(w.removeprefix('warning: '))}</li>" for w in comparison.warnings) + "</ul>",
        )
        if comparison.warnings
        else "",
    ]
    if comparison.op_diff is not None:
        lines_ = tables.op_diff_lines(comparison)
        body.append(
            _section(
                "Op diff",
                f"<p>{esc(lines_[0])}</p><ul>"
                + "".join(f"<li>{esc(line.strip().removeprefix('- '))}</li>" for line in lines_[1:])
                + "</ul>",
                anchor="ops",
            )
        )
    return _page("devprof compare", body)
