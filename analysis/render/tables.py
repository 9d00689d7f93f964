"""The tables that text and Markdown both show, cut from an `Analysis` (selection and rounding only)."""

from __future__ import annotations

import math

import pandas as pd

from analysis.render.names import distinct_names

STEP_COLUMNS = [
    "step",
    "steps",
    "step_ms",
    "input_ms",
    "compute_ms",
    "host_ms",
    "compile_ms",
    "input_pct",
    "compute_pct",
    "host_pct",
]
EPOCH_COLUMNS = [
    "epoch",
    "calls",
    "seconds",
    "input_s",
    "call_s",
    "other_host_s",
    "epoch_level_s",
    "input_pct",
    "call_pct",
    "other_host_pct",
    "epoch_level_pct",
]
DEVICE_COLUMNS = [
    "device",
    "step_count",
    "step_ms",
    "compute_ms",
    "input_ms",
    "copy_ms",
    "collective_ms",
    "idle_ms",
    "idle_input_ms",
    "idle_host_ms",
]
TOP_OPS = 10
STEP_HOW = {
    "markers": "step marker",
    "trace_groups": "the trace's step groups",
    "program_executions": "executions of",
    "window": "one interval:",
}


TOLERANCE = 1e-6


def check_figures(analysis) -> None:
    """The invariant every renderer holds an analysis to: no negative time, no share over 100 %
    (a process's CPU, `proc_cpu_pct`, counts 100 per core and may exceed it).
    The readers clean what would break it (rows written twice, epochs shorter than their steps);
    a figure that still breaks it is a bug, and is refused rather than printed."""
    tables = [("steps", analysis.steps), ("mean", pd.DataFrame([analysis.mean]))]
    if analysis.epochs is not None:
        tables.append(("epochs", analysis.epochs))
    for name, frame in tables:
        for column in frame.columns:
            if not (column.endswith(("_ms", "_s", "_pct")) and pd.api.types.is_numeric_dtype(frame[column])):
                continue
            if column == "start_time_s":
                continue
            values = frame[column].astype(float)
            if (values < -TOLERANCE).any():
                raise ValueError(
                    f"internal error: {name} {column} is negative ({values.min():g}); "
                    "please report it with the run directory"
                )
            if column.endswith("_pct") and not column.startswith("proc_") and (values > 100 + TOLERANCE).any():
                raise ValueError(
                    f"internal error: {name} {column} is over 100 % ({values.max():g}); "
                    "please report it with the run directory"
                )


def has_collective(analysis) -> bool:
    """Whether the steps wait in collectives (several workers or devices): then every format shows
    that part beside input, compute and host, so that the parts add up to the step."""
    steps, mean = analysis.steps, analysis.mean
    in_steps = "collective_ms" in steps and bool((steps["collective_ms"].fillna(0) > 0).any())
    return in_steps or float(mean.get("collective_ms", 0.0) or 0.0) > 0


def step_parts(analysis) -> tuple[str, ...]:
    """The parts a step is cut into, as the renderers name them."""
    return ("input", "compute", "collective", "host") if has_collective(analysis) else ("input", "compute", "host")


def steps_table(analysis) -> pd.DataFrame:
    columns = STEP_COLUMNS
    if has_collective(analysis):
        columns = [c for c in STEP_COLUMNS if c != "host_pct"] + ["collective_pct", "host_pct"]
        columns.insert(columns.index("host_ms"), "collective_ms")
    steps = analysis.steps
    if "collective_pct" in columns and "collective_pct" not in steps:
        steps = steps.assign(
            collective_pct=100.0 * steps["collective_ms"] / steps["step_ms"].where(steps["step_ms"] > 0)
        )
    return steps[columns].round(3)


MAX_TEXT_STEPS = 20  # step rows a terminal shows; JSON and the CSVs have every one
MAX_NAME = 60  # characters of an op, kernel or stage name in a terminal table
MAX_LINE = 200


def slowest_steps(frame: pd.DataFrame, limit: int = MAX_TEXT_STEPS) -> tuple[pd.DataFrame, int]:
    """At most `limit` rows, the slowest, in step order; and how many were left out."""
    if len(frame) <= limit:
        return frame, 0
    kept = frame["step_ms"].nlargest(limit).index.sort_values()
    return frame.loc[kept], len(frame) - limit


def short_name(name, limit: int = MAX_NAME):
    """One op or kernel name for a terminal, on its own (`short_names` tells a column's rows apart)."""
    return distinct_names([name], limit)[0]


def short_names(frame: pd.DataFrame, limit: int = MAX_NAME) -> pd.DataFrame:
    """`frame` with its text cells shortened column by column, each name told apart from the
    column's other rows (`render.names`; JSON and CSV keep them whole)."""
    out = frame.copy()
    for column in out.columns:
        if not pd.api.types.is_numeric_dtype(out[column]):
            out[column] = distinct_names(out[column].tolist(), limit)
    return out


def ops_table(analysis, top: int = TOP_OPS) -> pd.DataFrame:
    """The slowest ops for a terminal: time and share, then the roofline's columns where any op has them."""
    ops = analysis.ops.head(top)
    out = ops[["op", "type", "device", "count_per_step", "ms_per_step", "compute_pct"]].round(3)
    if "program" in ops and (ops["program"] != "").any():  # XLA's op names repeat across programs
        out["op"] = [f"{p}/{o}" if p else o for p, o in zip(ops["program"], ops["op"])]
    if "flops_per_second" in ops and ops["flops_per_second"].notna().any():
        out["FLOP/s"] = [_si(v, "") if v == v else "" for v in ops["flops_per_second"]]
        out["FLOP/B"] = ops["intensity"].round(1)
    if "ceiling_pct" in ops and ops["ceiling_pct"].notna().any():
        out["bound"] = ops["bound"]
        out["ceiling%"] = ops["ceiling_pct"].round(0)
    return short_names(out)


def epochs_table(analysis) -> pd.DataFrame:
    return analysis.epochs[EPOCH_COLUMNS].round(3)


def devices_table(analysis, recorded_only: bool = False) -> pd.DataFrame:
    devices = analysis.devices
    if recorded_only and "recorded" in devices:
        devices = devices[devices["recorded"].astype(bool)]
    columns = DEVICE_COLUMNS + [
        c for c in ("input_overlapped_ms", "outside_steps_ms") if c in devices and (devices[c].fillna(0) > 0).any()
    ]
    return devices[columns].round(3)


SHOWN_WORKERS = 10  # rows a report shows: the highest straggler scores; workers.csv and the JSON hold every worker


def workers_table(analysis) -> pd.DataFrame:
    frame = analysis.workers
    if len(frame) < 2:  # one worker holds nobody back
        frame = frame.drop(columns=["straggler_score"], errors="ignore")
    if len(frame) > SHOWN_WORKERS and "straggler_score" in frame:
        frame = frame.sort_values("straggler_score", ascending=False, kind="stable").head(SHOWN_WORKERS)
    return frame.round(3)


def worker_summary_lines(analysis) -> list[str]:
    """How many workers the table leaves out, and the spread of step time across workers."""
    out = []
    hidden = len(analysis.workers) - SHOWN_WORKERS
    if hidden > 0:
        out.append(
            f"the {SHOWN_WORKERS} highest straggler scores of {len(analysis.workers)} workers; {hidden} more in "
            "workers.csv and the JSON"
        )
    spread = analysis.worker_distribution
    if spread:
        own, step = spread["own_step_ms"], spread["step_ms"]
        out.append(
            f"step time across {spread['workers']} workers (ms): without collective wait p50 {own['p50']:.1f}, "
            f"p90 {own['p90']:.1f}, max {own['max']:.1f}; whole step p50 {step['p50']:.1f}, "
            f"p90 {step['p90']:.1f}, max {step['max']:.1f}"
        )
    return out


def header_lines(analysis) -> list[str]:
    unit = ("call" if analysis.steps_per_call > 1 else "step") + ("s" if len(analysis.steps) != 1 else "")
    if analysis.step_source == "steps_csv":
        lines = [
            f"source: {analysis.path} (no profiler trace)",
            f"device: {analysis.device}; {len(analysis.steps)} {unit}",
        ]
    else:
        how = STEP_HOW.get(analysis.step_source, analysis.step_source)
        lines = [
            f"trace: {analysis.path}",
            f"device: {analysis.device}; {len(analysis.steps)} {unit} found by {analysis.step_source} "
            f"({how} '{analysis.step_name}')",
        ]
    if analysis.steps_per_call > 1:
        lines.append(f"steps per call: {analysis.steps_per_call} (one marker per tf.function call)")
    lines += [f"note: {note}" for note in analysis.notes]
    return lines


def verdict_title(verdict: dict) -> str:
    if verdict["bound"] is None:
        return f"none ({verdict['reason']})"
    pct = verdict.get("bound_pct")
    share = f", {pct:.0f} % of the step" if isinstance(pct, (int, float)) else ""
    return f"{verdict['bound']}-bound" + (f" ({verdict['level']}{share})" if verdict["level"] else "")


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def roofline_lines(analysis) -> list[str]:
    """The roofline's totals in a sentence or two: FLOPs per step against the model's, MFU, what is unknown."""
    roof = getattr(analysis, "roofline", None)
    if not roof:
        return []
    out = []
    flops = roof.get("flops_per_step", math.nan)
    if flops == flops:
        achieved = roof.get("achieved_flops_per_second", math.nan)
        line = f"roofline: {_si(flops, 'FLOP')} per training step from the ops' costs"
        if achieved != achieved:  # else the achieved rate says what it covers
            line += f" ({roof['known_time_pct']:.0f} % of op time has known costs)"
        model = roof.get("model_flops_per_step", math.nan)
        if model == model:
            line += f"; the model's {_si(model, 'FLOP')} per step ({roof['flops_gap_pct']:+.1f} %)"
        if achieved == achieved:
            line += f"; {_si(achieved, 'FLOP/s')} achieved {roof.get('achieved_over') or ''}".rstrip()
            if roof.get("mfu_pct", math.nan) == roof.get("mfu_pct", math.nan):
                ceiling = roof["ceilings"].get(roof["dtype"], {}).get("matrix_flops_per_second", math.nan)
                line += (
                    f", {roof['mfu_pct']:.1f} % of the {roof['dtype']} matrix ceiling ({_si(ceiling, 'FLOP/s')}, "
                    f"{roof['ceilings_source']})"
                )
        out.append(line)
    out += [f"roofline: {note}" for note in roof.get("notes", [])]
    return out


MAX_OUTLIERS = 10  # slow steps named in a line; the JSON has every one


def short_ms(value: float, digits: int = 3) -> str:
    """`digits` significant digits, trailing zeros kept (7.70, 14.2, 0.270); whole ms from 1000 on."""
    return f"{value:,.0f}" if abs(value) >= 10**digits else f"{value:#.{digits}g}".rstrip(".")


def spread_line(analysis) -> str | None:
    """The steady steps' median and p90, and each step over 1.5x the median with the part that made it
    slow (`spread`); None where there is no spread (fewer than 2 steady steps)."""
    spread = getattr(analysis, "spread", None)
    if not spread:
        return None
    noun = "call" if analysis.steps_per_call > 1 else "step"
    count = analysis.steps_used
    line = (
        f"spread over {count} {noun}{'s' if count != 1 else ''}: median {short_ms(spread['median_ms'])} ms, "
        f"p90 {short_ms(spread['p90_ms'])} ms; "
    )
    slow = spread["outliers"]
    if not slow:
        return line + f"no {noun} over 1.5x the median"
    named = ", ".join(
        f"{noun} {o['step']} {short_ms(o['step_ms'])} ms ({o['cause']} {'+' if o['excess_ms'] >= 0 else ''}"
        f"{short_ms(o['excess_ms'], 2)} ms)"
        for o in slow[:MAX_OUTLIERS]
    )
    more = f", and {len(slow) - MAX_OUTLIERS} more in the JSON" if len(slow) > MAX_OUTLIERS else ""
    return f"{line}{len(slow)} {noun}{'s' if len(slow) != 1 else ''} over 1.5x the median: {named}{more}"


def findings_lines(findings: list[dict], bullet: str) -> list[str]:
    if not findings:
        return []
    return ["findings (the largest saving first):"] + [
        f"{bullet}[{f['severity']}] {f['rule']}: {f['evidence']} Fix: {f['advice']}.{_finding_saving(f)}"
        for f in findings
    ]


def saving_sentence(item: dict) -> str:
    """ "fixing this would save about 3.10 ms of 8.50 per step (36 %)" for a verdict or finding with a
    known saving; its share alone where the step's length is unknown; "" where the saving is unknown."""
    pct, ms = item.get("saving_pct"), item.get("saving_ms")
    if pct is None:
        return ""
    if pct <= 0:
        return "fixing this would save no measurable step time"
    if ms is None:
        return f"fixing this would save about {pct:.0f} % of the step"
    return f"fixing this would save about {ms:.2f} ms of {100.0 * ms / pct:.2f} per step ({pct:.0f} %)"


def verdict_saving_lines(verdict: dict) -> list[str]:
    """The verdict's saving with its basis, and XProf's reading where it differs."""
    if verdict.get("bound") is None:
        return []
    sentence = saving_sentence(verdict)
    basis = verdict.get("saving_basis")
    out = [f"saving: {sentence} ({basis})" if sentence else f"saving: unknown ({basis})"] if basis else []
    fixes = verdict.get("fixes") or []
    if len(fixes) > 1:
        out.append("fixes, largest saving first: " + "; ".join(f"{fix['rule']} {_fix_size(fix)}" for fix in fixes))
    if verdict.get("xprof_reading"):
        out.append(f"xprof: {verdict['xprof_reading']}")
    return out


def _fix_size(fix: dict) -> str:
    ms, pct = fix.get("saving_ms"), fix.get("saving_pct")
    return f"{ms:.2f} ms ({pct:.0f} %)" if ms is not None else f"{pct:.0f} % of the step"


def _finding_saving(finding: dict) -> str:
    sentence = saving_sentence(finding)
    return f" Saving: {sentence} ({finding.get('saving_basis')})." if sentence else ""


def straggler_line(analysis) -> str | None:
    """The straggler, or why there is none; None for a single worker (nobody to hold back)."""
    straggler = analysis.straggler
    if straggler:
        return f"straggler: {straggler['worker']} ({straggler['cause']}): {straggler['evidence']}"
    if len(analysis.workers) < 2:
        return None
    return f"straggler: none ({analysis.straggler_reason or 'no worker stands out'})"


def worker_parts(worker: dict) -> str:
    """A worker sub-row of compare: its epoch's shares, the collective wait among them."""
    parts = [("input", "input"), ("compute", "compute"), ("collective", "collective"), ("host", "host")]
    return ", ".join(f"{label} {worker[f'{part}_pct']:.0f} %" for part, label in parts if f"{part}_pct" in worker)


def external_notes(table: pd.DataFrame) -> list[str]:
    return list(table.loc[table["external"] & (table["notes"] != ""), "notes"].unique())


def op_diff_lines(comparison) -> list[str]:
    diff = comparison.op_diff
    return describe(diff["rows"], diff["unit"], diff["gap"], diff["a"], diff["b"])


def describe(rows: pd.DataFrame, unit: str, gap: float, a_name: str, b_name: str, top: int = 10) -> list[str]:
    """Sentences such as "Conv2DBackpropFilter: 41.2 -> 12.3 ms/step, explains 38 % of the 76 ms/step gap"."""
    short = "ms/image" if unit == "ms_per_image" else "ms/step"
    lines = [
        f"op diff, {b_name} against {a_name} ({abs(gap):.3g} {short} "
        f"{'slower' if gap > 0 else 'faster'}; rows add up to the gap):"
    ]
    shown = rows.head(top)
    for row, name in zip(shown.itertuples(), distinct_names(shown["op"].tolist(), MAX_NAME)):
        only = {"a": f" (only in {a_name})", "b": f" (only in {b_name})"}.get(row.only_in, "")
        share = (
            f"explains {row.share_pct:.0f} % of the {abs(gap):.3g} {short} gap"
            if row.share_pct == row.share_pct
            else "no gap to explain"
        )
        lines.append(f"  - {name}{only}: {row.a_ms:.3g} -> {row.b_ms:.3g} {short}, {share}")
    if len(rows) > top:
        lines.append(f"  ... {len(rows) - top} more rows in the JSON or CSV output")
    return lines


def compare_display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The human table: rounded, memory in MiB, `*` on the baseline, `(ext)` on external rows."""
    out = pd.DataFrame()
    out["run"] = [
        f"{'(external)' if r['external'] and r['run'] == r['device'] else r['run']}{' *' if r['baseline'] else ''}"
        for _, r in table.iterrows()
    ]
    out["device"] = table["device"].astype(str)
    out["s/epoch"] = table["seconds_per_epoch"].map(lambda v: f"{v:.3g}")
    out["images/s"] = table["images_per_second"].map(_fmt(1))
    out["speedup"] = table["speedup"].map(lambda v: f"{v:.2f}x" if v < 10 else f"{v:.1f}x")
    parts = [
        ("input", "input%"),
        ("compute", "compute%"),
        ("collective", "collective%"),
        ("host", "host%"),
        ("epoch_level", "epoch%"),
    ]
    for part, title in parts:
        if part == "collective" and not (table[f"{part}_pct"].fillna(0) > 0).any():
            continue  # no run waits in collectives (one device each): no column of zeros
        out[title] = table[f"{part}_pct"].map(_fmt(1))
    out["cpu% mean/p95"] = [_pair(a, b) for a, b in zip(table["cpu_util_mean_pct"], table["cpu_util_p95_pct"])]
    out["dev% mean/p95"] = [_pair(a, b) for a, b in zip(table["device_util_mean_pct"], table["device_util_p95_pct"])]
    out["host MiB"] = (table["host_mem_peak_bytes"] / 2**20).map(_fmt(0))
    out["dev MiB"] = (table["device_mem_peak_bytes"] / 2**20).map(_fmt(0))
    out["GFLOP/s (peak)"] = [
        "-" if pd.isna(a) else f"{a / 1e9:.0f} ({'-' if pd.isna(p) else f'{p / 1e9:.0f}'})"
        for a, p in zip(table["achieved_flops_per_second"], table["peak_flops_per_second"])
    ]
    out["MFU%"] = table["mfu_pct"].map(_fmt(1))
    measured = [c for c in out.columns if (out[c] != "-").any()]
    return out[measured]  # columns nobody measured (e.g. utilization of external rows) are left out


def _fmt(digits: int):
    return lambda v: "-" if pd.isna(v) else f"{v:.{digits}f}"


def _pair(a, b) -> str:
    return "-" if pd.isna(a) else f"{a:.0f}/{b:.0f}"


MEMORY_LIVE_SHOWN = 3  # live groups named per allocator in text; the HTML table and the JSON have ten


def size(value) -> str:
    """Bytes in binary units: 266.7 MiB, 4.77 GiB, 10.5 KiB; '-' for none."""
    if value is None or value != value:
        return "-"
    for factor, unit, digits in ((2**40, "TiB", 2), (2**30, "GiB", 2), (2**20, "MiB", 1), (2**10, "KiB", 1)):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}f} {unit}"
    return f"{value:.0f} B"


def live_name(live) -> str:
    """One group of allocations live at a peak, as a line names it."""
    if not live.in_window:
        return live.unnamed
    what = " ".join(part for part in (live.shape, live.dtype) if part)
    many = f" x{live.count}" if live.count and live.count > 1 else ""
    return (live.op or f"({live.unnamed})") + (f" {what}" if what else "") + f" ({live.region}{many})"


def peak_sentence(peak) -> str:
    """An allocator's peak, against its capacity where stated, and where it fell."""
    share = f" of {size(peak.capacity_bytes)} ({100 * peak.capacity_share:.0f} %)" if peak.capacity_bytes > 0 else ""
    step = f"step {peak.peak_step}" if peak.peak_step is not None else "between steps"
    op = f", in {peak.peak_op}" if peak.peak_op else ""
    frag = f"; fragmentation {100 * peak.fragmentation:.1f} %" if peak.fragmentation == peak.fragmentation else ""
    lifetime = ""
    if peak.lifetime_above_window:
        of = f" ({100 * peak.lifetime_peak_bytes / peak.capacity_bytes:.1f} %)" if peak.capacity_bytes > 0 else ""
        lifetime = f"; its own lifetime peak, before the window, was {size(peak.lifetime_peak_bytes)}{of}"
    return (
        f"peak {size(peak.peak_bytes)}{share} at {step} ({peak.peak_time_ms:.1f} ms into the window){op}{frag}"
        f"{lifetime}"
    )


def headroom_sentence(peak, batch: float) -> str:
    if peak.max_batch == peak.max_batch:
        against = (
            "the machine's available memory"
            if peak.headroom_basis == "available_memory"
            else "the allocator's capacity"
        )
        return f"headroom: a batch of about {peak.max_batch:,.0f} fits {against} (today {batch:,.0f}): {peak.headroom}"
    return f"headroom: {peak.headroom}"


def oom_allocation(failure) -> str:
    """The allocation that failed: its size, tensor, op and allocator, as far as TensorFlow's message said."""
    size_ = f"{size(failure.bytes)} ({failure.bytes:,} bytes)" if failure.bytes is not None else "memory"
    shape = f"[{','.join(map(str, failure.shape))}]" if failure.shape is not None else None
    tensor = " ".join(v for v in (shape, failure.dtype) if v)
    where = failure.allocator or failure.device
    return (
        f"allocating {size_}"
        + (f" for a {tensor} tensor" if tensor else "")
        + (f" in {failure.op}" if failure.op else "")
        + (f" on {where}" if where else "")
    )


def oom_held(failure) -> str:
    """What held the memory when the allocation failed: the trace's allocator, else the samplers."""
    if failure.source == "trace":
        of = f" of its {size(failure.capacity_bytes)}" if failure.capacity_bytes > 0 else ""
        return (
            f"held then: {failure.held_allocator} {size(failure.held_bytes)}{of} (its last traced event, "
            f"{failure.before_failure_ms:.1f} ms before the failure)"
        )
    if failure.source == "samplers":
        values = "; ".join(
            f"{what} ({sampler}) {size(last)}" + (f" of {size(total)}" if total > 0 else "")
            for sampler, what, last, total in failure.sampled
        )
        return f"held then (no allocator event traced at the failure; each sampler's last value before it): {values}"
    return "held then: not recorded (neither a trace nor a sampler covered the failure)"


def oom_lines(memory) -> list[str]:
    """The out-of-memory error that ended the run, first in the memory lines (indented: its details)."""
    failure = memory.oom
    if failure is None:
        return []
    out = [f"out of memory, which ended the run: {oom_allocation(failure)}", f"  {oom_held(failure)}"]
    if failure.top:
        live = "; ".join(f"{size(item.bytes)} {live_name(item)}" for item in failure.top[:MEMORY_LIVE_SHOWN])
        out.append(f"  live then: {live}")
    return out


def memory_lines(analysis) -> list[str]:
    """Each allocator's peak, what held it, its headroom and growth; the sampled memory over the run."""
    memory = analysis.memory
    if memory is None:
        return []
    out = ["", "memory (the allocators' own events in the traced window; every event in memory.csv):"]
    out += [f"  {line}" for line in oom_lines(memory)]
    if not memory.allocators:
        out[1] = "memory:"
        out.append("  allocators: not recorded (no MemoryAllocation events traced)")
    for peak in memory.allocators:
        out.append(f"  {peak.name}: {peak_sentence(peak)}")
        live = "; ".join(f"{size(item.bytes)} {live_name(item)}" for item in peak.top_at_peak[:MEMORY_LIVE_SHOWN])
        out.append(f"    live at the peak: {live}")
        out.append(f"    {headroom_sentence(peak, memory.batch_size)}")
        if peak.growth_bytes_per_step == peak.growth_bytes_per_step:
            out.append(f"    held at step end grows {size(peak.growth_bytes_per_step)} a step")
    if memory.workers:
        out.append(f"  every worker's allocators (the lines above are {worker_name(memory.workers[0].worker)}'s):")
        out += [f"    {line}" for line in worker_memory_lines(memory)]
    out += [f"  {line}" for line in sampled_memory_lines(memory)]
    return out


def worker_name(worker) -> str:
    return f"worker {worker}" if isinstance(worker, int) else str(worker)


def worker_memory_lines(memory) -> list[str]:
    """One line per worker of a job: each of its allocators' peak against its capacity."""
    out = []
    for worker in memory.workers:
        peaks = "; ".join(
            f"{peak.name} {size(peak.peak_bytes)}"
            + (
                f" of {size(peak.capacity_bytes)} ({100 * peak.capacity_share:.0f} %)"
                if peak.capacity_bytes > 0
                else ""
            )
            for peak in worker.allocators
        )
        out.append(f"{worker_name(worker.worker)}: {peaks or 'no allocator events traced'}")
    return out


def sampled_memory_lines(memory) -> list[str]:
    """Each sampled memory over the run: its peak, at each epoch's end, its growth."""
    out = []
    for sampled in memory.sampled:
        grows = (
            f", growing {size(sampled.growth_bytes_per_epoch)} an epoch"
            if sampled.growth_bytes_per_epoch == sampled.growth_bytes_per_epoch
            else ""
        )
        total = f" of {size(sampled.total_bytes)}" if sampled.total_bytes == sampled.total_bytes else ""
        ends = ", ".join(size(v) for v in sampled.epoch_end_bytes)
        out.append(
            f"{sampled.what} ({sampled.sampler}.csv): peak {size(sampled.peak_bytes)}{total}"
            + (f"; at each epoch's end {ends}" if ends else "")
            + grows
        )
    return out
