"""XProf's own per-step breakdown of a trace, to check devprof against (the tests' oracle).

Wraps `xprof.convert.raw_to_tool_data.xspace_to_tool_data(..., "input_pipeline_analyzer")`,
which returns a JSON list of Google-DataTable tables; the second table holds one row
per step (`stepnum` like "train 4", `stepTimeMs`, `infeedTimeMs`, `hostComputeTimeMs`,
`otherTimeMs`, ...) and its `p` properties hold the summary and conclusion.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

STEP_TABLE_COLUMNS = {
    "stepTimeMs": "step_ms",
    "infeedTimeMs": "input_ms",
    "hostComputeTimeMs": "host_compute_ms",
    "deviceComputeTimeMs": "device_compute_ms",
    "kernelLaunchTimeMs": "kernel_launch_ms",
    "compileTimeMs": "compile_ms",
    "otherTimeMs": "other_ms",
}


def input_pipeline_json(xplane: str | Path) -> list:
    """XProf's input_pipeline_analyzer output for one `.xplane.pb`, parsed."""
    from xprof.convert import raw_to_tool_data

    data, _content_type = raw_to_tool_data.xspace_to_tool_data(
        [str(xplane)], "input_pipeline_analyzer", {"use_saved_result": False}
    )
    if isinstance(data, bytes):
        data = data.decode()
    return json.loads(data)


def xprof_steps(xplane: str | Path) -> tuple[pd.DataFrame, dict]:
    """XProf's per-step breakdown as a DataFrame (`step`, `*_ms`) and its summary properties.

    The DataFrame is empty when XProf found no steps ("No step time measured").
    """
    tables = input_pipeline_json(xplane)
    step_table: dict = next(
        (t for t in tables if any(c.get("id") == "stepTimeMs" for c in t.get("cols", []))), {"cols": [], "rows": []}
    )
    ids = [c["id"] for c in step_table["cols"]]
    rows = [[cell.get("v") if cell else None for cell in row["c"]] for row in step_table.get("rows", [])]
    frame = pd.DataFrame(rows, columns=ids)
    result = pd.DataFrame({"step": pd.Series(dtype="int64")})
    if not frame.empty:
        result = pd.DataFrame({"step": frame["stepnum"].map(lambda s: int(re.findall(r"-?\d+", str(s))[-1]))})
        for source, target in STEP_TABLE_COLUMNS.items():
            if source in frame:
                result[target] = frame[source].astype(float)
    return result, dict(step_table.get("p", {}))


def tensorflow_own_analysis(xplane: str | Path) -> dict | None:
    """What TensorFlow itself wrote beside `xplane` at capture (older versions did:
    `<host>.input_pipeline.pb`, else the input analysis inside `<host>.overview_page.pb`), read
    here straight from the messages: `steps`, `step_ms` (mean), `input_pct`. None where neither
    file holds steps."""
    from xprof.protobuf import input_pipeline_pb2, overview_page_pb2

    xplane = Path(xplane)
    stem = xplane.name.removesuffix(".xplane.pb")
    result = None
    pipeline = xplane.parent / f"{stem}.input_pipeline.pb"
    overview = xplane.parent / f"{stem}.overview_page.pb"
    if pipeline.is_file() and pipeline.stat().st_size:
        result = input_pipeline_pb2.InputPipelineAnalysisResult.FromString(pipeline.read_bytes())
    if (result is None or not result.step_details) and overview.is_file() and overview.stat().st_size:
        result = overview_page_pb2.OverviewPage.FromString(overview.read_bytes()).input_analysis
    if result is None or not result.step_details:
        return None
    return {
        "steps": len(result.step_details),
        "step_ms": result.step_time_summary.average,
        "input_pct": result.input_percent or result.input_percent_summary.average,
    }


def beside_devprof(path: str | Path, xplane: str | Path) -> pd.DataFrame:
    """devprof's mean step and input share beside TensorFlow's own analysis of the same capture
    (one row each; TensorFlow's row only where it wrote one): `source`, `steps`, `step_ms`, `input_pct`."""
    from analysis import analyze

    ours = analyze(path)
    rows = [
        {
            "source": "devprof",
            "steps": ours.steps_used,
            "step_ms": ours.mean["step_ms"],
            "input_pct": ours.mean["input_pct"],
        }
    ]
    theirs = tensorflow_own_analysis(xplane)
    if theirs is not None:
        rows.append({"source": "tensorflow", **theirs})
    return pd.DataFrame(rows, columns=["source", "steps", "step_ms", "input_pct"])


def xprof_memory_profile(xplane: str | Path) -> dict:
    """XProf's Memory Profile tool for one `.xplane.pb`: per allocator, its peak bytes in use
    (`peak_bytes`, the largest heap + stack of the window), `capacity_bytes` and the allocations it
    lists as live at the peak (`live`: (op, bytes) pairs, the largest first; what was allocated
    before the peak's step is its "unused preallocated device memory")."""
    from xprof.convert import raw_to_tool_data

    data, _content_type = raw_to_tool_data.xspace_to_tool_data([str(xplane)], "memory_profile", {})
    document = json.loads(data.decode() if isinstance(data, bytes) else data)
    result = {}
    for name, profile in document.get("memoryProfilePerAllocator", {}).items():
        summary = profile["profileSummary"]
        live = []
        for entry in profile.get("activeAllocations", []):
            snapshot, special = int(entry.get("snapshotIndex", -1)), int(entry.get("specialIndex", -1))
            metadata = (
                profile["memoryProfileSnapshots"][snapshot]["activityMetadata"]
                if snapshot >= 0
                else profile["specialAllocations"][special]
            )
            live.append((metadata.get("tfOpName"), int(metadata.get("allocationBytes", 0))))
        result[name] = {
            "peak_bytes": int(summary["peakStats"]["peakBytesInUse"]),
            "capacity_bytes": int(summary.get("memoryCapacity", 0)),
            "live": live,
        }
    return result
