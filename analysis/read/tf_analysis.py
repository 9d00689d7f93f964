"""TensorFlow's own analysis of a trace, where the profiler wrote one beside it: a second opinion.

TensorFlow up to about 2.5 converted each capture at once and wrote the results next to
`<host>.xplane.pb`: `<host>.input_pipeline.pb` (an `InputPipelineAnalysisResult`: its steps,
their time, the share waiting for input) and `<host>.overview_page.pb` (an `OverviewPage`
holding the same result and TensorFlow's verdict). They are read here once, with the message
classes of the installed profile plugin (`xprof.protobuf`, no TensorFlow import), into a
`TensorFlowAnalysis`. Missing files are no error; a file that is there but cannot be read is
left out with one warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from analysis.read.run_files import warn

INPUT_PIPELINE = ".input_pipeline.pb"
OVERVIEW_PAGE = ".overview_page.pb"
# These files are a few kB; a bigger one is not TensorFlow's analysis of one capture.
MAX_FILE_BYTES = 64 * 2**20
# XProf's running statistics start their maximum at the smallest double: a summary with that
# maximum had no sample (the part was not measured), which is not the same as a measured 0.
_NEVER_SAMPLED = 1e-300
_BREAKDOWN = {
    "input_ms": "input_ms_summary",
    "host_wait_input_ms": "host_wait_input_ms_summary",
    "host_to_device_ms": "host_to_device_ms_summary",
    "host_compute_ms": "host_compute_ms_summary",
    "device_compute_ms": "device_compute_ms_summary",
    "compile_ms": "host_compile_ms_summary",
}


@dataclass(frozen=True)
class TensorFlowAnalysis:
    """What TensorFlow's converter said about the capture. Times are means per step in ms; NaN
    where TensorFlow measured nothing (a part its summary never sampled)."""

    files: tuple[Path, ...]  # the files it was read from
    hardware: str  # TensorFlow's hardware type: CPU_ONLY, GPU, TPU ("" when not written)
    steps: int  # the steps TensorFlow found
    step_ms: float
    input_pct: float  # input share of step time, 0-100
    input_ms: float = math.nan
    host_wait_input_ms: float = math.nan
    host_to_device_ms: float = math.nan
    host_compute_ms: float = math.nan
    device_compute_ms: float = math.nan
    compile_ms: float = math.nan
    bound: str = ""  # TensorFlow's bottleneck: "input", "device", "host", ... ("" when not written)
    statement: str = ""  # its sentence about it


def _parse(path: Path, message_class):
    """The message in `path`, None when the file is missing or empty, or (with a warning) unreadable."""
    from google.protobuf.message import DecodeError

    try:
        if not path.is_file():
            return None
        size = path.stat().st_size
        if size == 0:  # TensorFlow writes an empty file for a tool with nothing to say
            return None
        if size > MAX_FILE_BYTES:
            warn(f"{path}: {size} bytes, too big for TensorFlow's analysis of one capture: left out")
            return None
        message = message_class()
        message.ParseFromString(path.read_bytes())
    except (DecodeError, OSError, ValueError, RuntimeError) as exc:
        warn(f"{path}: cannot be read as TensorFlow's analysis ({exc or type(exc).__name__}): left out")
        return None
    if not message.ListFields():
        warn(f"{path}: holds nothing TensorFlow's analysis writes: left out")
        return None
    return message


def _summary(stat) -> float:
    return math.nan if 0 < stat.maximum < _NEVER_SAMPLED else float(stat.average)


def _mean_step_ms(result) -> float:
    """The mean of the per-step times (CPU and GPU steps), where the summary was not written."""
    from xprof.protobuf import input_pipeline_pb2

    times = []
    for packed in result.step_details:
        details = input_pipeline_pb2.PerGenericStepDetails()
        if packed.Unpack(details):
            times.append(details.step_time_ms)
    return math.fsum(times) / len(times) if times else math.nan


def _from_result(result, files: tuple[Path, ...], bound: str, statement: str) -> TensorFlowAnalysis | None:
    from xprof.protobuf import input_pipeline_pb2

    count = len(result.step_details)
    if count == 0:
        return None
    step_ms = float(result.step_time_summary.average) or _mean_step_ms(result)
    input_pct = float(result.input_percent) or float(result.input_percent_summary.average)
    parts = {}
    breakdown = input_pipeline_pb2.GenericStepTimeBreakdown()
    if result.step_time_breakdown.Is(breakdown.DESCRIPTOR) and result.step_time_breakdown.Unpack(breakdown):
        parts = {key: _summary(getattr(breakdown, field)) for key, field in _BREAKDOWN.items()}
    if not bound:
        analysis = input_pipeline_pb2.BottleneckAnalysis()
        if result.recommendation.bottleneck_analysis.Unpack(analysis):
            bound, statement = analysis.input_classification, analysis.input_statement
    if not (math.isfinite(step_ms) and step_ms > 0 and math.isfinite(input_pct) and 0 <= input_pct <= 100):
        warn(
            f"{files[0]}: TensorFlow's step time {step_ms:g} ms or input share {input_pct:g} % is not a time: left out"
        )
        return None
    return TensorFlowAnalysis(
        files=files,
        hardware=str(result.hardware_type),
        steps=count,
        step_ms=step_ms,
        input_pct=input_pct,
        bound=bound,
        statement=statement,
        **parts,
    )


def read_tf_analysis(xplane: str | Path) -> TensorFlowAnalysis | None:
    """TensorFlow's analysis written beside `xplane` (`<host>.input_pipeline.pb`, else the input
    analysis inside `<host>.overview_page.pb`), with the overview page's verdict; None where
    there is none (newer TensorFlow writes only the trace)."""
    xplane = Path(xplane)
    stem = xplane.parent / xplane.name.removesuffix(".xplane.pb")
    pipeline_path, overview_path = Path(f"{stem}{INPUT_PIPELINE}"), Path(f"{stem}{OVERVIEW_PAGE}")
    if not (pipeline_path.is_file() or overview_path.is_file()):
        return None
    try:
        from xprof.protobuf import input_pipeline_pb2, overview_page_pb2
    except ImportError:
        warn(
            f"{xplane.parent}: TensorFlow's own analysis is there but the profile plugin "
            "(tensorboard-plugin-profile) is not installed to read it: left out"
        )
        return None
    overview = _parse(overview_path, overview_page_pb2.OverviewPage)
    bound, statement = "", ""
    files: tuple[Path, ...] = ()
    if overview is not None:
        bound, statement = overview.recommendation.bottleneck, overview.recommendation.statement
        files = (overview_path,)
    result = _parse(pipeline_path, input_pipeline_pb2.InputPipelineAnalysisResult)
    if result is not None and len(result.step_details):
        files = (pipeline_path, *files)
    elif overview is not None and overview.HasField("input_analysis"):
        result = overview.input_analysis
    if result is None:
        return None
    return _from_result(result, files, bound, statement)


__all__ = ["TensorFlowAnalysis", "read_tf_analysis"]
