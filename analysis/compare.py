"""Compare runs (and timings measured elsewhere) side by side, and say why each is slower.

One row per run: seconds per epoch in steady state (the median of the epochs after the
first; the only epoch if there is just one), images/s, speed-up against a baseline, the
epoch split into input / compute / host overhead / epoch-level work (from `steps.csv`
through `analysis.epochs.epoch_breakdown`, with the trace's compute share where the run
has a trace), utilization and memory from the samplers, and achieved FLOP/s against the
device peak measured by `devprof peak` (run.json `peak`).

The *why* of a row compares per-image time of each component with the fastest row and
names the component whose difference explains most of the gap, with the advice that fits.

Reading (`read_run`, `read_external`) is kept apart from the pure DataFrame functions
(`run_row`, `external_rows`, `compare`, `explain`); rendering and plotting come last.
TensorFlow is never imported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import epochs as epochs_mod
from analysis.run_files import DEVICE_UTILIZATION_COLUMNS
from analysis.verdict import classify

COMPONENTS = ("input", "compute", "host", "epoch_level")
STACKED = ("input", "compute", "host")  # the chart's parts; epoch-level work is drawn on top in grey
LABELS = {"input": "input", "compute": "compute", "host": "host overhead",
          "epoch_level": "epoch-level work (validation, iterator set-up)"}
PRECISION_PEAK_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
EXTERNAL_REQUIRED = ("device", "seconds_per_epoch")
EXTERNAL_OPTIONAL = ("batch_size", "images", "notes")
NICE_STEPS_PER_EXECUTION = (2, 4, 8, 16, 32, 50, 100, 200, 500, 1000)

TABLE_COLUMNS = ["run", "device", "seconds_per_epoch", "images_per_second", "speedup", "input_pct", "compute_pct",
                 "host_pct", "epoch_level_pct", "cpu_util_mean_pct", "cpu_util_p95_pct", "device_util_mean_pct",
                 "device_util_p95_pct", "host_mem_peak_bytes", "device_mem_peak_bytes", "mfu_pct"]


class CompareError(Exception):
    """Input that cannot be compared (not a run directory, no epochs, bad CSV): `error: ...`, exit 2."""


# ---------------------------------------------------------------- reading (I/O)


def read_run(path: str | Path) -> dict:
    """The files of one run directory: `{"path", "name", "meta", "steps", "trace_mean", "utilization"}`.

    `steps` is the steps.csv frame (None when absent); `trace_mean` the trace's mean steady
    step breakdown where the run has a readable trace (else None, with `trace_note`);
    `utilization` the sampler summaries (run.json's, else summarized from the CSVs).
    """
    path = Path(path)
    run_json = path / "run.json"
    if not path.is_dir() or not run_json.is_file():
        raise CompareError(f"{path} is not a run directory (no run.json); pass folders written by 'devprof run'")
    try:
        meta = json.loads(run_json.read_text())
    except (OSError, ValueError) as exc:
        raise CompareError(f"{run_json}: cannot read it ({exc})") from None
    if not isinstance(meta, dict) or not meta.get("epochs"):
        raise CompareError(f"{run_json} has no finished epochs yet; nothing to compare")
    steps = None
    if (path / "steps.csv").is_file():
        try:
            steps = epochs_mod.read_steps_csv(path / "steps.csv")
        except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise CompareError(f"{path / 'steps.csv'}: {exc}") from None
    trace_mean, trace_note = _read_trace_mean(path)
    return {"path": str(path), "name": path.name, "meta": meta, "steps": steps, "trace_mean": trace_mean,
            "trace_note": trace_note, "utilization": _read_utilization(path, meta)}


def _read_trace_mean(path: Path) -> tuple[dict | None, str | None]:
    """Mean steady-step breakdown of the run's trace, or (None, why not)."""
    if not any((path / "plugins" / "profile").glob("*/*.xplane.pb")):
        return None, None
    try:
        from analysis.steps import analyze_steps, mean_breakdown, steady_steps
        from analysis.trace import read_trace

        steps = analyze_steps(read_trace(path)).steps
        return mean_breakdown(steady_steps(steps)), None
    except Exception as exc:  # noqa: BLE001 - a bad trace falls back to steps.csv, with a note
        return None, f"trace not used ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


def _read_utilization(path: Path, meta: dict) -> dict:
    """`{sampler: {"metrics": {column: {"mean","p50","p95","max"}}}}`: run.json's summaries, else the CSVs'."""
    samplers = meta.get("samplers") or {}
    summaries = samplers.get("summaries") if isinstance(samplers, dict) else None
    if summaries:
        return summaries
    folder = path / "utilization"
    if not folder.is_dir():
        return {}
    try:  # the samplers' own summary (pure pandas), so both routes give the same numbers
        from profiler.samplers.summary import read_sampler_csv, summarize
    except ImportError:
        return {}
    result = {}
    for csv in sorted(folder.glob("*.csv")):
        try:
            result[csv.stem] = summarize(read_sampler_csv(csv))
        except (OSError, ValueError, pd.errors.ParserError):
            continue
    return result


def read_external(path: str | Path) -> pd.DataFrame:
    """A CSV of timings measured elsewhere: `device,seconds_per_epoch[,batch_size,images,notes]`."""
    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype={"device": str, "notes": str}, skipinitialspace=True)
    except FileNotFoundError:
        raise CompareError(f"external results file {path} not found") from None
    except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise CompareError(f"{path}: not a CSV of external results ({str(exc).splitlines()[0]})") from None
    return validate_external(frame, str(path))


def validate_external(frame: pd.DataFrame, source: str = "external CSV") -> pd.DataFrame:
    frame = frame.rename(columns=lambda c: str(c).strip())
    missing = [c for c in EXTERNAL_REQUIRED if c not in frame.columns]
    if missing:
        raise CompareError(f"{source}: missing column {', '.join(missing)} "
                           "(expected device,seconds_per_epoch[,batch_size,images,notes])")
    if frame.empty:
        raise CompareError(f"{source}: no rows")
    out = pd.DataFrame({"device": frame["device"].astype(str).str.strip()})
    for column in ("seconds_per_epoch", "batch_size", "images"):
        if column not in frame.columns:
            out[column] = np.nan
            continue
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() & frame[column].notna() if column != "seconds_per_epoch" else values.isna()
        if column == "seconds_per_epoch":
            bad |= values <= 0
        if bad.any():
            line = int(np.flatnonzero(bad.to_numpy())[0]) + 2
            raise CompareError(f"{source}, line {line}: {column} must be a positive number, "
                               f"got {frame[column].iloc[line - 2]!r}")
        out[column] = values.astype(float)
    if (out["device"] == "").any() or frame["device"].isna().any():
        raise CompareError(f"{source}: every row needs a device name")
    out["notes"] = frame["notes"].fillna("").astype(str) if "notes" in frame.columns else ""
    return out


# ---------------------------------------------------------------- rows (pure)


def steady_epochs(epochs: pd.DataFrame) -> pd.DataFrame:
    """The epochs after the first (which pays for tracing and compilation); the only one if just one."""
    epochs = epochs.sort_values("epoch")
    return epochs.iloc[1:] if len(epochs) > 1 else epochs


def steady_components(breakdown: pd.DataFrame, epochs_used: list[int], seconds_per_epoch: float,
                      trace_mean: dict | None = None) -> dict[str, float]:
    """Seconds per epoch of input / compute / host / epoch-level work in steady state.

    Shares are summed over the steady epochs of `epochs_mod.epoch_breakdown` and applied to
    `seconds_per_epoch`, so the four parts add up to it. Compute is the step call
    (`call_ms`); where a trace gives the step's compute share, compute is that share of
    step time (at most the call) and the rest of the call counts as host overhead
    (dispatch, launch, synchronization).
    """
    used = breakdown[breakdown["epoch"].isin(epochs_used)]
    if used.empty:
        used = breakdown
    total = float(used["seconds"].sum())
    input_s, call_s, other_s = (float(used[c].sum()) for c in ("input_s", "call_s", "other_host_s"))
    level_s = total - input_s - call_s - other_s  # epoch_level_s, without step_ms's rounding in steps.csv
    compute_s = call_s
    if trace_mean and trace_mean.get("step_ms", 0) > 0:
        step_s = input_s + call_s + other_s
        compute_s = min(call_s, step_s * float(trace_mean["compute_ms"]) / float(trace_mean["step_ms"]))
    host_s = call_s - compute_s + other_s
    parts = {"input": input_s, "compute": compute_s, "host": host_s, "epoch_level": level_s}
    scale = seconds_per_epoch / total if total > 0 else float("nan")
    out = {}
    for part, seconds in parts.items():
        out[f"{part}_s"] = seconds * scale
        out[f"{part}_pct"] = 100.0 * seconds / total if total > 0 else float("nan")
    assert math.isnan(scale) or math.isclose(sum(out[f"{p}_s"] for p in COMPONENTS), seconds_per_epoch,
                                             rel_tol=1e-9), "components must add up to seconds per epoch"
    return out


def utilization_stats(summaries: dict) -> dict[str, float]:
    """Mean/p95 CPU and device utilization and peak memory from sampler summaries."""
    nan = float("nan")
    out = {"cpu_util_mean_pct": nan, "cpu_util_p95_pct": nan, "device_util_mean_pct": nan,
           "device_util_p95_pct": nan, "host_mem_peak_bytes": nan, "device_mem_peak_bytes": nan}

    def stat(summary, column, key):
        value = ((summary or {}).get("metrics", {}).get(column) or {}).get(key)
        return float(value) if value is not None else nan

    host = summaries.get("host")
    if host:
        out["cpu_util_mean_pct"] = stat(host, "cpu_pct", "mean")
        out["cpu_util_p95_pct"] = stat(host, "cpu_pct", "p95")
        out["host_mem_peak_bytes"] = stat(host, "proc_rss_bytes", "max")
    means, p95s, memory = [], [], []
    for name, summary in summaries.items():
        if name == "host":
            continue
        for column in DEVICE_UTILIZATION_COLUMNS:
            if not math.isnan(stat(summary, column, "mean")):
                means.append(stat(summary, column, "mean"))
                p95s.append(stat(summary, column, "p95"))
                break
        for column in ("tf_mem_peak_bytes", "mem_used_bytes"):
            if not math.isnan(stat(summary, column, "max")):
                memory.append(stat(summary, column, "max"))
                break
    if means:
        out["device_util_mean_pct"] = float(np.mean(means))
        out["device_util_p95_pct"] = float(np.nanmax(p95s))
    if memory:
        out["device_mem_peak_bytes"] = float(max(memory))
    return out


def peak_flops(peak: dict | None, precision: str | None) -> tuple[float, str | None]:
    """(peak FLOP/s for the run's precision, dtype) from a `devprof peak` dict; NaN when unknown."""
    if not peak:
        return float("nan"), None
    dtype = PRECISION_PEAK_DTYPE.get(precision or "float32", "float32")
    value = (peak.get("matmul_flops_per_second") or {}).get(dtype)
    return (float(value), dtype) if value else (float("nan"), dtype)


def run_row(run: dict) -> dict:
    """One comparison row from `read_run`'s dict (pure: no file access)."""
    meta = run["meta"]
    config = meta.get("config") or {}
    device = meta.get("device") or {}
    epochs = pd.DataFrame(meta["epochs"])
    for column in ("epoch", "seconds"):
        if column not in epochs:
            raise CompareError(f"{run['path']}: run.json epochs lack {column!r}")
    steady = steady_epochs(epochs)
    seconds = float(steady["seconds"].median())
    images = float(steady["images"].median()) if "images" in steady else float("nan")
    row = {
        "run": run["name"], "path": run["path"], "device": str(device.get("name") or device.get("kind") or "?"),
        "kind": device.get("kind"), "external": False, "status": meta.get("status"),
        "precision": config.get("precision", "float32"), "jit_compile": bool(config.get("jit_compile")),
        "batch_size": _num(config.get("batch_size")),
        "steps_per_call": int(config.get("steps_per_execution") or 1),
        "steps_per_epoch": _num(meta.get("steps_per_epoch")),
        "epochs": int(len(epochs)), "epochs_used": [int(e) for e in steady["epoch"]],
        "seconds_per_epoch": seconds, "images_per_epoch": images,
        "images_per_second": images / seconds if seconds > 0 else float("nan"),
        "compute_source": "none", "notes": run.get("trace_note") or "",
    }
    for part in COMPONENTS:
        row[f"{part}_s"] = row[f"{part}_pct"] = float("nan")
    if run.get("steps") is not None and not run["steps"].empty:
        breakdown = epochs_mod.epoch_breakdown(run["steps"], epochs)
        row.update(steady_components(breakdown, row["epochs_used"], seconds, run.get("trace_mean")))
        row["compute_source"] = "trace" if run.get("trace_mean") else "steps.csv"
    row.update(utilization_stats(run.get("utilization") or {}))
    flops_per_image = _num((meta.get("model") or {}).get("train_flops_per_image"))
    peak, dtype = peak_flops(meta.get("peak"), row["precision"])
    row["train_flops_per_image"] = flops_per_image
    row["achieved_flops_per_second"] = flops_per_image * row["images_per_second"]
    row["peak_flops_per_second"] = peak
    row["peak_dtype"] = dtype
    row["mfu_pct"] = 100.0 * row["achieved_flops_per_second"] / peak if peak > 0 else float("nan")
    return row


def external_rows(external: pd.DataFrame) -> list[dict]:
    """Rows for timings measured elsewhere: only seconds per epoch (and images/s when images are given)."""
    rows = []
    for record in external.to_dict(orient="records"):
        seconds = float(record["seconds_per_epoch"])
        images = float(record.get("images", float("nan")))
        row = {"run": record["device"], "path": None, "device": record["device"], "kind": None, "external": True,
               "status": "external", "precision": None, "batch_size": float(record.get("batch_size", float("nan"))),
               "steps_per_call": None, "steps_per_epoch": float("nan"), "epochs": None, "epochs_used": [],
               "seconds_per_epoch": seconds, "images_per_epoch": images, "images_per_second": images / seconds,
               "compute_source": "none", "notes": record.get("notes") or ""}
        for part in COMPONENTS:
            row[f"{part}_s"] = row[f"{part}_pct"] = float("nan")
        row.update(utilization_stats({}))
        row.update({"train_flops_per_image": float("nan"), "achieved_flops_per_second": float("nan"),
                    "peak_flops_per_second": float("nan"), "peak_dtype": None, "mfu_pct": float("nan")})
        rows.append(row)
    return rows


def _num(value) -> float:
    try:
        return float(value) if value is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


# ---------------------------------------------------------------- the comparison (pure)


def pick_baseline(table: pd.DataFrame, baseline: str | None = None) -> int:
    """Index of the baseline row: the one named (run name, path or device), else the slowest."""
    if baseline is not None:
        wanted = baseline.strip()
        stripped = wanted.rstrip("/")
        matches = [i for i, row in table.iterrows()
                   if wanted in (row["run"], row["path"]) or stripped in (row["run"], row["path"])
                   or (isinstance(row["path"], str) and Path(row["path"]) == Path(stripped))]  # external: no path
        if not matches:
            matches = [i for i, row in table.iterrows() if str(row["device"]).lower() == wanted.lower()]
        if not matches:
            raise CompareError(f"--baseline {baseline!r} matches no run or device; "
                               f"choose one of: {', '.join(map(str, table['run']))}")
        if len(matches) > 1:
            raise CompareError(f"--baseline {baseline!r} matches {len(matches)} rows; name the run directory instead")
        return matches[0]
    if table["images_per_second"].notna().all():
        return int(table["images_per_second"].idxmin())
    return int(table["seconds_per_epoch"].idxmax())


def speedups(table: pd.DataFrame, base: int) -> pd.Series:
    """Throughput relative to the baseline: images/s ratio where both know their images, else s/epoch ratio."""
    b = table.loc[base]
    by_images = table["images_per_second"] / b["images_per_second"]
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


def suggest_steps_per_execution(host_pct: float, compute_pct: float, steps_per_call: int,
                                steps_per_epoch: float = float("nan"), target_pct: float = 5.0) -> int:
    """Steps per call that would bring per-call host overhead to about `target_pct` of step time.

    With host overhead h paid once per call and compute c per step, k steps per call leave
    h / (h + k c); k >= h (100 - target) / (target c), rounded up to a usual value.
    """
    if not (compute_pct > 0) or not (host_pct > 0):
        return NICE_STEPS_PER_EXECUTION[2]
    per_call_host = host_pct * steps_per_call  # host overhead is paid once per call
    needed = per_call_host * (100.0 - target_pct) / (target_pct * compute_pct)
    choice = next((k for k in NICE_STEPS_PER_EXECUTION if k >= needed), NICE_STEPS_PER_EXECUTION[-1])
    if steps_per_epoch == steps_per_epoch and steps_per_epoch >= 1:
        choice = min(choice, int(steps_per_epoch))
    return max(choice, steps_per_call + 1)


def advice(row: dict | pd.Series, component: str) -> str:
    """The change that fits a component of one row."""
    if component == "input":
        return ("the loop waits for batches: add .prefetch(tf.data.AUTOTUNE), a parallel .map(num_parallel_calls="
                "tf.data.AUTOTUNE) and .cache() to the input pipeline")
    if component == "host":
        k = int(row.get("steps_per_call") or 1)
        suggestion = suggest_steps_per_execution(row["host_pct"], row["compute_pct"], k, row.get("steps_per_epoch",
                                                                                                  float("nan")))
        if k <= 1:
            return f"at 1 step per call; try --steps-per-execution {suggestion}"
        return f"already {k} steps per call; try --steps-per-execution {suggestion} or cut per-step Python work"
    if component == "compute":
        mixed = "mixed_float16" if row.get("kind") == "gpu" else "mixed_bfloat16"
        mfu = row.get("mfu_pct", float("nan"))
        at_peak = (f"the epoch runs at {mfu:.0f} % of the device's measured {row.get('peak_dtype')} peak; "
                   if mfu == mfu else "")
        tries = [] if row.get("precision") not in (None, "float32") else [f"--precision {mixed}"]
        if row.get("kind") != "cpu" and not row.get("jit_compile"):  # XLA is slower than oneDNN on CPUs
            tries.append("--jit-compile")
        already = f"already {row.get('precision')}; " if row.get("precision") not in (None, "float32") else ""
        return f"{at_peak}{already}try {' and '.join(tries + ['a larger --batch-size'])}, or a faster device"
    if component == "epoch_level":
        return "time outside the training steps (validation, iterator set-up): validate less often or on fewer images"
    return ""


def explain(row: dict | pd.Series, fastest: dict | pd.Series) -> str:
    """Why `row` is slower than `fastest`, in one sentence with numbers and advice."""
    device = row.get("label", row["device"])
    other = fastest.get("label", fastest["device"])
    has_parts = not pd.isna(row["input_pct"])
    fastest_parts = not pd.isna(fastest["input_pct"])
    if row["run"] == fastest["run"]:
        if not has_parts:
            return f"{device}: fastest ({row['seconds_per_epoch']:.3g} s/epoch); measured elsewhere, no breakdown"
        bound, _ = classify(row["input_pct"], row["host_pct"])
        part = {"input": "input", "host": "host", "compute": "compute"}[bound]
        return (f"{device}: fastest ({row['seconds_per_epoch']:.3g} s/epoch), {bound}-bound: "
                f"{_parts_text(row)}; {advice(row, part)}")
    ratio = _slower_ratio(row, fastest)
    if _same_images(row, fastest):
        numbers = f"{row['seconds_per_epoch']:.3g} vs {fastest['seconds_per_epoch']:.3g} s/epoch"
    else:
        numbers = f"{row['images_per_second']:.0f} vs {fastest['images_per_second']:.0f} images/s"
    head = f"{device}: {ratio:.1f}x slower than {other} ({numbers})"
    if not has_parts:
        return f"{head}; measured elsewhere, no breakdown: run it under 'devprof run' to see why"
    if not fastest_parts:
        part = max(COMPONENTS, key=lambda p: row[f"{p}_pct"])
        return (f"{head}; the faster one has no breakdown; here {LABELS[part]} is {row[f'{part}_pct']:.0f} % "
                f"of the epoch ({_parts_text(row)}); {advice(row, part)}")
    gaps = per_image_gaps(row, fastest)
    total = sum(gaps.values())
    part = max(gaps, key=gaps.get)
    share = 100.0 * gaps[part] / total if total > 0 else float("nan")
    mine, theirs = _per_image_ms(row, part), _per_image_ms(fastest, part)
    return (f"{head}; {LABELS[part]} explains {share:.0f} % of the {total:.3g} ms/image gap "
            f"({mine:.3g} vs {theirs:.3g} ms/image; {row[f'{part}_pct']:.0f} % {_short(part)} in its epoch); "
            f"{advice(row, part)}")


def _short(part: str) -> str:
    return LABELS[part].split(" (")[0]


def _same_images(row, other) -> bool:
    mine, theirs = row["images_per_epoch"], other["images_per_epoch"]
    return pd.isna(mine) or pd.isna(theirs) or mine == theirs


def _slower_ratio(row, fastest) -> float:
    if not (pd.isna(row["images_per_second"]) or pd.isna(fastest["images_per_second"])):
        return fastest["images_per_second"] / row["images_per_second"]
    return row["seconds_per_epoch"] / fastest["seconds_per_epoch"]


def _per_image_ms(row, part: str) -> float:
    return 1000.0 * row[f"{part}_s"] / row["images_per_epoch"]


def per_image_gaps(row, fastest) -> dict[str, float]:
    """ms/image each component costs `row` more than `fastest` (negative: less)."""
    return {part: _per_image_ms(row, part) - _per_image_ms(fastest, part) for part in COMPONENTS}


def _parts_text(row) -> str:
    return ", ".join(f"{_short(p)} {row[f'{p}_pct']:.0f} %" for p in COMPONENTS)


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
    table["bound"] = [classify(r["input_pct"], r["host_pct"])[0] if not pd.isna(r["input_pct"]) else None
                      for _, r in table.iterrows()]
    table["flags"] = flags_for(table, base)
    repeated = table["device"].duplicated(keep=False)
    table["label"] = table["device"].where(~repeated, table["run"])  # same device twice: name the runs
    fastest = table.loc[int(table["speedup"].idxmax())]
    table["fastest"] = table["run"] == fastest["run"]
    table["why"] = [explain(r, fastest) for _, r in table.iterrows()]
    return table


def compare_runs(runs, externals=(), baseline: str | None = None) -> pd.DataFrame:
    """The comparison table of run directories `runs` and external CSVs `externals`."""
    rows = [run_row(read_run(path)) for path in runs]
    for csv in externals:
        rows += external_rows(read_external(csv))
    return compare(rows, baseline)


def render(table: pd.DataFrame, fmt: str, plot_name: str | None = None) -> str:
    """`fmt` is text, markdown, json or csv."""
    if fmt == "json":
        return json.dumps(to_json(table), indent=2) + "\n"
    if fmt == "csv":
        return to_csv_frame(table).to_csv(index=False)
    if fmt == "markdown":
        return render_markdown(table, plot_name)
    return render_text(table)


def warnings(table: pd.DataFrame) -> list[str]:
    return [f"warning: {row['run']}: {flag}" for _, row in table.iterrows() for flag in row["flags"]]


# ---------------------------------------------------------------- output


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def to_json(table: pd.DataFrame) -> dict:
    """`{"baseline": run, "fastest": run, "warnings": [...], "rows": [...]}`; NaN becomes null."""
    rows = [{key: _jsonable(value) for key, value in record.items()} for record in table.to_dict(orient="records")]
    return {"baseline": str(table.loc[table["baseline"], "run"].iloc[0]),
            "fastest": str(table.loc[table["fastest"], "run"].iloc[0]),
            "warnings": warnings(table), "rows": rows}


def to_csv_frame(table: pd.DataFrame) -> pd.DataFrame:
    frame = table.copy()
    frame["flags"] = frame["flags"].map("; ".join)
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
    out += _notes(table)
    out += warnings(table)
    return "\n".join(out) + "\n"


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


def plot_compare(table: pd.DataFrame, path: str | Path) -> Path:
    """Horizontal bars of seconds per epoch per device, stacked input / compute / host overhead (+ epoch-level).

    External rows have no breakdown and are drawn as one hatched bar.
    """
    from analysis import plots

    plt = plots._pyplot()
    labels = [f"{r['device']}{' (ext)' if r['external'] else ''}" + (f"\n{r['run']}" if r["run"] != r["device"] else "")
              for _, r in table.iterrows()]
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.55 * len(table)))
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for part in STACKED:
        values = table[f"{part}_s"].fillna(0.0).to_numpy()
        ax.barh(y, values, left=left, color=plots.PART_COLORS[part], label=f"{LABELS[part]} (s)" if values.any() else None)
        left += values
    level = table["epoch_level_s"].fillna(0.0).to_numpy()
    ax.barh(y, level, left=left, color="#7f7f7f", label="epoch-level (s)" if level.any() else None)
    external = table["input_s"].isna().to_numpy()
    if external.any():
        ax.barh(y[external], table["seconds_per_epoch"].to_numpy()[external], color="white", edgecolor="black",
                hatch="//", label="no breakdown (s)")
    for yi, seconds in zip(y, table["seconds_per_epoch"]):
        ax.text(seconds, yi, f" {seconds:.3g} s", va="center", fontsize="small")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("seconds per epoch")
    ax.set_title("Seconds per epoch by device")
    ax.legend(loc="lower right", fontsize="x-small")
    return plots.save(fig, path)
