"""The report's utilization and memory lines: per step on the step chart's axis where the steps
carry the samplers' columns, else over the whole run's wall-clock time with its epochs shaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.render.html_charts import SERIES_COLORS, Band, Series, esc, legend, lines, nice_ticks, num
from analysis.render.html_page import _missing, _section, _step_bins

# Per-step utilization columns (the sampler CSVs' names), where the steps carry them.
STEP_UTILIZATION = (
    "cpu_pct",
    "proc_cpu_pct",
    "proc_rss_bytes",
    "mem_used_bytes",
    "gpu_util_pct",
    "gpu_mem_used_bytes",
    "mxu_util_pct",
)


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
            section = section.replace(
                "</section>",
                "<h3>Over the whole run</h3>" + _utilization_over_run(analysis, nested=True) + "</section>",
            )
        return section
    if not analysis.samplers:
        why = (
            "a profiler trace on its own has no samplers; `devprof run` records them"
            if analysis.run_dir is None
            else "this run has no utilization/*.csv (sampling was off)"
        )
        return _section(
            "Utilization and memory",
            _missing(f"CPU, process and GPU utilization and memory: not recorded ({why})."),
            anchor="utilization",
        )
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
        label = (
            f"training process CPU % (of all {cores:g} cores)"
            if cores == cores
            else "training process CPU % (100 = one core)"
        )
        cpu.append(Series(label, x, column("proc_cpu_pct", cores if cores == cores else 1.0), "#1f77b4", "4 3"))
    for name, label in (
        ("gpu_util_pct", "GPU utilization % (mean of the GPUs)"),
        ("mxu_util_pct", "TPU matrix units %"),
    ):
        if has(name):
            cpu.append(Series(label, x, column(name), "#2ca02c"))
    for name, label, color, dash in (
        ("proc_rss_bytes", "training process memory (RSS)", "#9467bd", ""),
        ("mem_used_bytes", "machine memory used", "#9467bd", "4 3"),
        ("gpu_mem_used_bytes", "GPU memory used (the fullest GPU)", "#ff7f0e", ""),
    ):
        if has(name):
            memory.append(Series(label, x, column(name, 2**30), color, dash))
    found = {
        "machine CPU": has("cpu_pct"),
        "process CPU": has("proc_cpu_pct"),
        "GPU": has("gpu_util_pct") or has("mxu_util_pct"),
        "memory": has("proc_rss_bytes") or has("mem_used_bytes") or has("gpu_mem_used_bytes"),
    }
    return _utilization_section(
        cpu,
        memory,
        x_range,
        ticks,
        "step",
        found,
        "Per step: the samples' time-weighted mean over each step, on the step chart's axis.",
    )


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
            label = (
                f"{name}: training process CPU % (of all {cores:g} cores)"
                if cores == cores
                else f"{name}: training process CPU % (100 = one core)"
            )
            cpu.append(Series(label, x, frame["proc_cpu_pct"].to_numpy(float) / scale, "#1f77b4", "4 3", hold=True))
        for column, what in (("gpu_util_pct", "GPU utilization %"), ("mxu_util_pct", "TPU matrix units %")):
            if column in frame and frame[column].notna().any():
                found["GPU"] = True
                cpu.append(Series(f"{name}: {what}", x, frame[column].to_numpy(float), next(colors), hold=True))
        if "proc_rss_bytes" in frame:
            found["memory"] = True
            memory.append(
                Series(
                    f"{name}: training process memory (RSS)",
                    x,
                    frame["proc_rss_bytes"].to_numpy(float) / 2**30,
                    "#9467bd",
                )
            )
        if "mem_used_bytes" in frame and frame["mem_used_bytes"].notna().any():
            found["memory"] = True
            is_host = "cpu_pct" in frame
            memory.append(
                Series(
                    f"{name}: {'machine' if is_host else 'device'} memory used",
                    x,
                    frame["mem_used_bytes"].to_numpy(float) / 2**30,
                    "#9467bd" if is_host else next(colors),
                    "4 3" if is_host else "",
                )
            )
    return cpu, memory, found


def _utilization_over_run(analysis, nested: bool = False) -> str:
    """Sampler lines over the run's wall-clock time, epochs shaded (the steps carry no wall-clock time)."""
    origins = [float(frame["time_s"].min()) for frame in analysis.samplers.values()]
    ends = [float(frame["time_s"].max()) for frame in analysis.samplers.values()]
    bands = []
    if analysis.epochs is not None and len(analysis.epoch_starts_s) == len(analysis.epochs):
        for start, (_, epoch) in zip(analysis.epoch_starts_s, analysis.epochs.iterrows()):
            bands.append(
                (float(start), float(start) + float(epoch["seconds"]), int(epoch["epoch"]), float(epoch["seconds"]))
            )
    origin = min(origins + [b[0] for b in bands])
    end = max(ends + [b[1] for b in bands])

    def x_of(t):
        return np.asarray(t, dtype=float) - origin

    cpu, memory, found = _sampler_series(analysis, x_of)
    span = end - origin
    ticks = [(t, f"{num(t)} s") for t in nice_ticks(span, 8) if t <= span]
    shaded = [Band(s - origin, e - origin, f"epoch {n}", f"epoch {n}: {num(sec)} s") for s, e, n, sec in bands]
    note = (
        "Over the whole run (seconds since the first sample), epochs shaded; each value is held over the interval "
        "it measured."
    )
    if not nested:
        note += " The steps above carry no wall-clock time, so the samples are not placed on them."
    return _utilization_section(cpu, memory, (0.0, span or 1.0), ticks, "", found, note, shaded, nested)


def _utilization_section(
    cpu: list[Series],
    memory: list[Series],
    x_range,
    ticks,
    x_title: str,
    found: dict,
    note: str,
    bands: Sequence[Band] = (),
    nested: bool = False,
) -> str:
    parts = [
        legend(
            [
                (s.name, s.color if not s.dash else f"repeating-linear-gradient(90deg,{s.color} 0 4px,#fff 4px 7px)")
                for s in cpu
            ]
        )
    ]
    if cpu:
        top = max((float(np.nanmax(s.y)) for s in cpu if np.isfinite(s.y).any()), default=100.0)
        parts.append(
            lines(
                cpu,
                "%",
                "utilization",
                x_range=x_range,
                y_max=max(100.0, top),
                height=190,
                x_ticks=ticks,
                x_title=x_title,
                bands=bands,
            )
        )
    else:
        parts.append(_missing("CPU and GPU utilization: not recorded."))
    if memory:
        parts.append(
            legend(
                [
                    (
                        s.name,
                        s.color if not s.dash else f"repeating-linear-gradient(90deg,{s.color} 0 4px,#fff 4px 7px)",
                    )
                    for s in memory
                ]
            )
        )
        parts.append(
            lines(memory, "GiB", "memory", x_range=x_range, height=150, x_ticks=ticks, x_title=x_title, bands=bands)
        )
    else:
        parts.append(_missing("memory: not recorded."))
    if not nested:
        parts.append(_recorded_line(found))
    parts.append(f'<p class="caption">{esc(note)}</p>')
    if nested:
        return "".join(parts)
    return _section("Utilization and memory", *parts, anchor="utilization")
