"""TensorFlow's own analysis files (`<host>.overview_page.pb`, `<host>.input_pipeline.pb`) written beside a trace."""

from __future__ import annotations

from pathlib import Path

from xprof.protobuf import input_pipeline_pb2, overview_page_pb2

DBL_MIN = 2.2250738585072014e-308  # XProf's maximum of a summary that never had a sample


def _summary(average: float | None) -> input_pipeline_pb2.StepSummary:
    if average is None:  # not measured, as XProf writes it
        return input_pipeline_pb2.StepSummary(maximum=DBL_MIN)
    return input_pipeline_pb2.StepSummary(average=average, minimum=average, maximum=average)


def input_result(
    *,
    steps: int,
    step_ms: float,
    input_pct: float,
    host_wait_input_ms: float | None = None,
    host_to_device_ms: float | None = None,
    host_compute_ms: float | None = None,
    hardware: str = "CPU_ONLY",
) -> input_pipeline_pb2.InputPipelineAnalysisResult:
    """An InputPipelineAnalysisResult as TensorFlow writes it: `steps` equal steps of `step_ms`."""
    result = input_pipeline_pb2.InputPipelineAnalysisResult(hardware_type=hardware, input_percent=input_pct)
    result.step_time_summary.CopyFrom(_summary(step_ms))
    result.input_percent_summary.CopyFrom(_summary(input_pct))
    for number in range(steps):
        result.step_details.add().Pack(
            input_pipeline_pb2.PerGenericStepDetails(
                step_number=number,
                step_time_ms=step_ms,
                host_wait_input_ms=host_wait_input_ms or 0.0,
                host_to_device_ms=host_to_device_ms or 0.0,
                host_compute_ms=host_compute_ms or 0.0,
            )
        )
    input_ms = (
        None
        if host_wait_input_ms is None and host_to_device_ms is None
        else (host_wait_input_ms or 0.0) + (host_to_device_ms or 0.0)
    )
    breakdown = input_pipeline_pb2.GenericStepTimeBreakdown(
        host_wait_input_ms_summary=_summary(host_wait_input_ms),
        host_to_device_ms_summary=_summary(host_to_device_ms),
        input_ms_summary=_summary(input_ms),
        host_compute_ms_summary=_summary(host_compute_ms),
        device_compute_ms_summary=_summary(None),
        host_compile_ms_summary=_summary(None),
    )
    result.step_time_breakdown.Pack(breakdown)
    return result


def write_overview(xplane: Path, result, bound: str = "input", statement: str = "Your program is input-bound.") -> Path:
    page = overview_page_pb2.OverviewPage(input_analysis=result)
    page.recommendation.bottleneck = bound
    page.recommendation.statement = statement
    path = xplane.parent / xplane.name.replace(".xplane.pb", ".overview_page.pb")
    path.write_bytes(page.SerializeToString())
    return path
