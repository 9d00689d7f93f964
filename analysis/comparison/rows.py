"""One comparison row per run or external timing (pure: no file access)."""

from __future__ import annotations

import math

import pandas as pd

from analysis.breakdown import epochs as epochs_mod
from analysis.breakdown import roofline
from analysis.breakdown.utilization import headline
from analysis.comparison.errors import UnusableRun
from analysis.comparison.reading import RunRead
from analysis.read import run_files
from analysis.rules.devices import peak_dtype

COMPONENTS = ("input", "compute", "collective", "host", "epoch_level")


def steady_epochs(epochs: pd.DataFrame) -> pd.DataFrame:
    """The epochs after the first (which pays for tracing and compilation); the only one if just one."""
    epochs = epochs.sort_values("epoch")
    return epochs.iloc[1:] if len(epochs) > 1 else epochs


def steady_components(
    breakdown: pd.DataFrame, epochs_used: list[int], seconds_per_epoch: float, trace_mean: dict | None = None
) -> dict[str, float]:
    """Seconds per epoch of input / compute / collective / host / epoch-level work in steady state.

    Shares are summed over the steady epochs of `epochs_mod.epoch_breakdown` and applied to
    `seconds_per_epoch`, so the five parts add up to it. Compute is the step call
    (`call_ms`); where a trace gives the step's compute and collective shares, each is that
    share of step time (together at most the call) and the rest of the call counts as host
    overhead (dispatch, launch, synchronization). The collective wait (a worker waiting in the
    all-reduce for the others) is inside the call, and steps.csv cannot tell it apart: without
    a trace it stays in compute, and it is 0 on one device.
    """
    used = breakdown[breakdown["epoch"].isin(epochs_used)]
    if used.empty:
        used = breakdown
    total = float(used["seconds"].sum())
    input_s, call_s, other_s = (float(used[c].sum()) for c in ("input_s", "call_s", "other_host_s"))
    level_s = total - input_s - call_s - other_s  # epoch_level_s, without step_ms's rounding in steps.csv
    compute_s, collective_s = call_s, 0.0
    if trace_mean and trace_mean.get("step_ms", 0) > 0:
        step_s = input_s + call_s + other_s
        share = step_s / float(trace_mean["step_ms"])
        compute_s = min(call_s, share * float(trace_mean["compute_ms"]))
        collective_s = min(call_s - compute_s, share * float(trace_mean.get("collective_ms") or 0.0))
    host_s = call_s - compute_s - collective_s + other_s
    parts = {"input": input_s, "compute": compute_s, "collective": collective_s, "host": host_s, "epoch_level": level_s}
    scale = seconds_per_epoch / total if total > 0 else float("nan")
    out = {}
    for part, seconds in parts.items():
        out[f"{part}_s"] = seconds * scale
        out[f"{part}_pct"] = 100.0 * seconds / total if total > 0 else float("nan")
    assert math.isnan(scale) or math.isclose(sum(out[f"{p}_s"] for p in COMPONENTS), seconds_per_epoch, rel_tol=1e-9), (
        "components must add up to seconds per epoch"
    )
    return out


def peak_flops(peak: dict | None, precision: str | None) -> tuple[float, str | None]:
    """(peak FLOP/s for the run's precision, dtype) from a `devprof peak` dict; NaN when unknown."""
    if not peak:
        return float("nan"), None
    dtype = peak_dtype(precision)
    # A peak of format 3 or older (run.json of earlier runs) has only the matmul's rate.
    value = (peak.get("peak_flops_per_second") or peak.get("matmul_flops_per_second") or {}).get(dtype)
    return (float(value), dtype) if value else (float("nan"), dtype)


def run_row(run: RunRead) -> dict:
    """One comparison row from a run's read (pure: no file access)."""
    record = run.record
    config = record.config
    device = record.device
    try:
        epochs = record.epochs()
    except run_files.RunFileError as exc:
        raise UnusableRun(str(exc)) from None
    if epochs.empty:
        raise UnusableRun(f"{run.path}/{run_files.RUN_JSON} has no finished epochs yet; nothing to compare")
    steady = steady_epochs(epochs)
    seconds = float(steady["seconds"].median())
    images = float(steady["images"].median()) if "images" in steady else float("nan")
    train_seconds = float(steady["train_seconds"].median()) if "train_seconds" in steady else float("nan")
    row = {
        "run": run.name,
        "path": run.path,
        "device": str(device.get("name") or device.get("kind") or "?"),
        "kind": device.get("kind"),
        "external": False,
        "status": record.status,
        "precision": config.get("precision", "float32"),
        "jit_compile": bool(config.get("jit_compile")),
        "bfloat16_units": device.get("bfloat16_units") if isinstance(device.get("bfloat16_units"), list) else None,
        "batch_size": _num(config.get("batch_size")),
        "steps_per_call": int(config.get("steps_per_execution") or 1),
        "steps_per_epoch": _num(record.steps_per_epoch),
        "epochs": int(len(epochs)),
        "epochs_used": [int(e) for e in steady["epoch"]],
        "seconds_per_epoch": seconds,
        "images_per_epoch": images,
        "train_seconds_per_epoch": train_seconds,
        # as Keras and the console count it: training images over training time
        "images_per_second": images / train_seconds if train_seconds > 0 else float("nan"),
        # the whole epoch, validation included, like seconds_per_epoch (speed-ups use this)
        "epoch_images_per_second": images / seconds if seconds > 0 else float("nan"),
        "compute_source": "none",
        "notes": run.trace_note or "",
        "prefetches": run.prefetches,
    }
    for part in COMPONENTS:
        row[f"{part}_s"] = row[f"{part}_pct"] = float("nan")
    row["median_step_ms"] = row["median_ms_per_image"] = float("nan")
    steps = run.files.steps_table
    if steps is not None and not steps.empty:
        steady_calls = steps[steps["epoch"].isin(row["epochs_used"])]
        if steady_calls.empty:
            steady_calls = steps
        per_step = steady_calls["step_ms"] / steady_calls["steps"]
        row["median_step_ms"] = float(per_step.median())
        row["median_ms_per_image"] = float((steady_calls["step_ms"] / steady_calls["images"]).median())
        breakdown = epochs_mod.epoch_breakdown(steps, epochs, str(record.path))
        row.update(steady_components(breakdown, row["epochs_used"], seconds, run.trace_mean))
        row["compute_source"] = "trace" if run.trace_mean else "steps.csv"
    row.update(headline(run.files.summaries))
    row.update(_job_cpu(run, row))
    row["workers"] = [_worker_subrow(worker) for worker in run.workers]
    flops_per_image, row["flops_source"] = _flops_per_image(run, row["batch_size"])
    peak, dtype = peak_flops(record.peak, row["precision"])
    row["train_flops_per_image"] = flops_per_image
    row["achieved_flops_per_second"] = flops_per_image * row["images_per_second"]
    row["peak_flops_per_second"] = peak
    row["peak_dtype"] = dtype
    row["mfu_pct"] = 100.0 * row["achieved_flops_per_second"] / peak if peak > 0 else float("nan")
    row["matrix_flops_per_second"] = measured_matrix_rates(record.peak)
    return row


def measured_matrix_rates(peak: dict | None) -> dict[str, float]:
    """`{dtype: matrix FLOP/s}` a `devprof peak` measured: what precision advice compares."""
    ceilings = roofline.ceilings_from_peak(peak, "run.json peak")
    if ceilings is None:
        return {}
    return {
        dtype: values["matrix_flops_per_second"]
        for dtype, values in ceilings.by_dtype.items()
        if dtype != roofline.ANY_DTYPE
        and values.get("matrix_flops_per_second") == values.get("matrix_flops_per_second")
    }


# The ops' own FLOPs stand for the step's when the ops with known costs hold at least this share of op time.
OPS_FLOPS_MIN_KNOWN_PCT = 90.0


def _flops_per_image(run: RunRead, batch_size: float) -> tuple[float, str]:
    """Training FLOPs per image, and where they come from: the traced ops' costs ("ops") where they
    cover the step, else the model's layers as run.json records them ("model")."""
    roof = run.analysis.roofline if run.analysis is not None else None
    record = run.record
    batch = _num(record.raw.get("per_worker_batch_size")) if run.workers else batch_size
    if roof and _num(roof.get("known_time_pct")) >= OPS_FLOPS_MIN_KNOWN_PCT and batch > 0:
        per_step = _num(roof.get("flops_per_step"))
        if per_step > 0:
            return per_step / batch, "ops"
    return _num(record.model.get("train_flops_per_image")), "model"


WORKER_SUBROW_KEYS = (
    "run",
    "seconds_per_epoch",
    "images_per_second",
    "input_pct",
    "compute_pct",
    "collective_pct",
    "host_pct",
    "epoch_level_pct",
    "cpu_util_mean_pct",
)


def _job_cpu(run: RunRead, row: dict) -> dict:
    """A job's workers on the chief's machine are the job, not other processes taking its CPU (as
    `analyze` counts them): their process CPU is the job's, and only the rest is contention."""
    host = run.record.device.get("host")
    local = [worker for worker in run.workers if host and worker.record.device.get("host") == host]
    cpu = [headline(worker.files.summaries)["proc_cpu_mean_pct"] for worker in local]
    cores = row["cpu_cores"]
    if len(cpu) < 2 or not all(value == value for value in cpu) or not cores == cores:
        return {}
    job_cpu = float(sum(cpu))
    return {"proc_cpu_mean_pct": job_cpu, "other_cpu_mean_pct": max(0.0, row["cpu_util_mean_pct"] - job_cpu / cores)}


def _worker_subrow(worker: RunRead) -> dict:
    row = run_row(worker)
    return {key: row[key] for key in WORKER_SUBROW_KEYS}


def external_rows(external: pd.DataFrame) -> list[dict]:
    """Rows for timings measured elsewhere: only seconds per epoch (and images/s when images are given)."""
    rows = []
    for record in external.to_dict(orient="records"):
        seconds = float(record["seconds_per_epoch"])
        images = float(record.get("images", float("nan")))
        row = {
            "run": record.get("run") or record["device"],  # a tune's rows: its name and which setting
            "path": None,
            "device": record["device"],
            "kind": None,
            "external": True,
            "status": "external",
            "precision": None,
            "jit_compile": None,
            "bfloat16_units": None,
            "batch_size": float(record.get("batch_size", float("nan"))),
            "steps_per_call": None,
            "steps_per_epoch": float("nan"),
            "epochs": None,
            "epochs_used": [],
            "seconds_per_epoch": seconds,
            "images_per_epoch": images,
            "train_seconds_per_epoch": float("nan"),
            "images_per_second": float("nan"),
            "epoch_images_per_second": images / seconds,
            "compute_source": "none",
            "notes": record.get("notes") or "",
            "median_step_ms": float("nan"),
            "median_ms_per_image": float("nan"),
            "workers": [],
            "prefetches": None,
        }
        for part in COMPONENTS:
            row[f"{part}_s"] = row[f"{part}_pct"] = float("nan")
        row.update(headline({}))
        row.update(
            {
                "train_flops_per_image": float("nan"),
                "flops_source": None,
                "achieved_flops_per_second": float("nan"),
                "peak_flops_per_second": float("nan"),
                "peak_dtype": None,
                "mfu_pct": float("nan"),
                "matrix_flops_per_second": {},
            }
        )
        rows.append(row)
    return rows


def _num(value) -> float:
    try:
        return float(value) if value is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")
