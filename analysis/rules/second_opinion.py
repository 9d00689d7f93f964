"""devprof's figures beside TensorFlow's own analysis of the same capture, and why they differ.

TensorFlow's converter is an oracle that can be wrong too (it counts a host-to-device copy no
kernel overlaps as no input; it groups steps its own way): where the two differ by more than
`INPUT_POINTS` points of input share, or `STEP_PCT` % of step time, one note says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from analysis.read.tf_analysis import TensorFlowAnalysis

INPUT_POINTS = 5.0  # input shares further apart than this (percentage points) are explained
STEP_PCT = 5.0  # step times further apart than this (% of TensorFlow's) are explained
STEP_SOURCES = {
    "markers": "step markers",
    "trace_groups": "the trace's step groups",
    "program_executions": "executions of",
}


@dataclass(frozen=True)
class SecondOpinion:
    """TensorFlow's step time and input share beside devprof's, and the note when they differ."""

    tensorflow: TensorFlowAnalysis
    step_ms: float  # devprof's mean step (steady steps)
    input_pct: float  # devprof's input share
    note: str | None  # why they differ; None when within INPUT_POINTS and STEP_PCT

    @property
    def step_diff_pct(self) -> float:
        """devprof's step minus TensorFlow's, in % of TensorFlow's."""
        return 100.0 * (self.step_ms - self.tensorflow.step_ms) / self.tensorflow.step_ms

    @property
    def input_diff_points(self) -> float:
        return self.input_pct - self.tensorflow.input_pct

    def as_dict(self) -> dict:
        """The JSON key `tensorflow_analysis` (docs/json.md)."""
        tf = self.tensorflow
        return {
            "files": [f.name for f in tf.files],
            "hardware": tf.hardware or None,
            "steps": tf.steps,
            "step_ms": tf.step_ms,
            "input_pct": tf.input_pct,
            "input_ms": tf.input_ms,
            "host_wait_input_ms": tf.host_wait_input_ms,
            "host_to_device_ms": tf.host_to_device_ms,
            "host_compute_ms": tf.host_compute_ms,
            "device_compute_ms": tf.device_compute_ms,
            "bound": tf.bound or None,
            "statement": tf.statement or None,
            "devprof_step_ms": self.step_ms,
            "devprof_input_pct": self.input_pct,
            "step_diff_pct": self.step_diff_pct,
            "input_diff_points": self.input_diff_points,
            "note": self.note,
        }


def second_opinion(
    tf: TensorFlowAnalysis | None,
    mean: dict[str, float],
    step_source: str,
    step_name: str,
    steps_used: int,
    devices: pd.DataFrame,
) -> SecondOpinion | None:
    """devprof's mean beside TensorFlow's (None without TensorFlow's analysis); `devices` are the
    device rows (their `input_ms`: host-to-device copies no kernel overlaps)."""
    if tf is None:
        return None
    step_ms, input_pct = float(mean["step_ms"]), float(mean["input_pct"])
    opinion = SecondOpinion(tf, step_ms, input_pct, None)
    step_off = abs(opinion.step_diff_pct) > STEP_PCT
    input_off = abs(opinion.input_diff_points) > INPUT_POINTS
    if not (step_off or input_off):
        return opinion
    reasons = []
    if step_off or (input_off and steps_used != tf.steps):
        reasons.append(_steps_reason(tf, step_ms, step_source, step_name, steps_used))
    if input_off:
        reasons.append(_input_reason(tf, mean, devices))
    head = (
        f"TensorFlow's own analysis beside the trace ({tf.files[0].name}) says step {tf.step_ms:.2f} ms, input "
        f"{tf.input_pct:.1f} % over {_count(tf.steps)}; devprof {step_ms:.2f} ms, input {input_pct:.1f} % over "
        f"{_count(steps_used)}"
    )
    return SecondOpinion(tf, step_ms, input_pct, f"{head}: " + "; ".join(r for r in reasons if r))


def _count(steps: int) -> str:
    return f"{steps} step" + ("" if steps == 1 else "s")


def _steps_reason(tf: TensorFlowAnalysis, step_ms: float, step_source: str, step_name: str, steps_used: int) -> str:
    if step_source == "window":
        return (
            f"devprof found nothing that repeats and took the whole traced window as one step, where TensorFlow "
            f"grouped the work into {_count(tf.steps)} of its own ({step_ms - tf.step_ms:+.2f} ms per step is "
            "what lies outside its grouping)"
        )
    how = STEP_SOURCES.get(step_source, step_source)
    return (
        f"the steps are not the same: devprof's are {how} '{step_name}' ({steps_used} steady), "
        f"TensorFlow's its own grouping ({_count(tf.steps)})"
    )


def _input_reason(tf: TensorFlowAnalysis, mean: dict[str, float], devices: pd.DataFrame) -> str:
    higher = mean["input_pct"] > tf.input_pct
    copy_ms = (
        float(devices["input_ms"].max()) if "input_ms" in devices and devices["input_ms"].notna().any() else math.nan
    )
    tf_copy = tf.host_to_device_ms if math.isfinite(tf.host_to_device_ms) else 0.0
    if higher and math.isfinite(copy_ms) and copy_ms > tf_copy:
        return (
            f"devprof counts the host-to-device copy that no kernel overlaps as input ({copy_ms:.2f} ms per "
            f"device step; the device waits for its data), TensorFlow {tf_copy:.2f} ms"
        )
    overlapped = float(mean.get("input_overlapped_ms", 0.0) or 0.0)
    if not higher and overlapped > 0:
        return (
            f"devprof counts only the input the step waits for: {overlapped:.2f} ms per step of it ran while the "
            "devices computed, which TensorFlow counts as input"
        )
    return (
        f"TensorFlow's input is the host's wait for the batch ({tf.host_wait_input_ms:.2f} ms) and its "
        f"copies ({tf_copy:.2f} ms), devprof's {mean['input_ms']:.2f} ms"
    )


__all__ = ["INPUT_POINTS", "STEP_PCT", "SecondOpinion", "second_opinion"]
