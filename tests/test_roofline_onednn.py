"""The roofline's convolution rates against oneDNN's own: a short CPU run of the seed CNN with
oneDNN's verbose log on (each primitive execution with its own time and a wall-clock stamp),
and devprof's achieved FLOP/s of each convolution checked against FLOPs / oneDNN's time for the
same executions (those inside the profiled window)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis import analyze
from analysis.read.op_costs import read_op_costs

# onednn_verbose,v1,<ms since the epoch>,primitive,exec,cpu,convolution,<impl>,<prop>,<mds>,<attrs>,<aux>,<desc>,<ms>
EXEC = re.compile(r"^onednn_verbose,v\d+,(?P<at>[\d.]+),primitive,exec,cpu,convolution,(?P<impl>[^,]*),"
                  r"(?P<prop>[^,]*),.*,(?P<desc>mb\d+[^,]*),(?P<ms>[\d.]+)$")
DESC = re.compile(r"mb(?P<n>\d+)_ic(?P<ic>\d+)oc(?P<oc>\d+)_ih(?P<ih>\d+)oh(?P<oh>\d+)kh(?P<kh>\d+)")
PROP = {"Conv2D": "forward_training", "Conv2DBackpropInput": "backward_data",
        "Conv2DBackpropFilter": "backward_weights"}


def onednn_executions(stdout: str) -> pd.DataFrame:
    rows = []
    for line in stdout.splitlines():
        found = EXEC.match(line.strip())
        if found:
            shape = DESC.search(found["desc"])
            rows.append({"at_ns": float(found["at"]) * 1e6, "impl": found["impl"], "prop": found["prop"],
                         "shape": ",".join(shape[k] for k in ("n", "ic", "oc", "ih")), "ms": float(found["ms"])})
    return pd.DataFrame(rows)


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split("x")]


def convolution_shapes(costs: pd.DataFrame) -> dict[str, str]:
    """Layer scope -> "batch,input channels,output channels,input height" (oneDNN's problem), from its
    forward Conv2D."""
    shapes = {}
    for row in costs[costs["type"] == "Conv2D"].itertuples():
        image, kernel = (_dims(s) for s in row.input_shapes.split(";"))
        shapes[row.op.rsplit("/", 1)[0]] = f"{image[0]},{kernel[2]},{kernel[3]},{image[1]}"
    return shapes


def layer_scope(op: str) -> str:
    return op.removeprefix("gradient_tape/").rsplit("/", 1)[0].removesuffix("/convolution")


@pytest.mark.slow
def test_convolution_rates_agree_with_onednns_own_times(tmp_path):
    env = {**os.environ, "ONEDNN_VERBOSE": "profile_exec", "ONEDNN_VERBOSE_TIMESTAMP": "1",
           "TF_ENABLE_ONEDNN_OPTS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "profiler", "run", "--device", "cpu", "--data", "synthetic",
                           "--limit-images", "768", "--limit-test-images", "64", "--batch-size", "32", "--epochs", "1",
                           "--profile-steps", "8:20", "--no-sample", "--quiet", "--out", str(tmp_path),
                           "--run-name", "r"], env=env, capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "r"
    executions = onednn_executions(done.stdout)
    assert not executions.empty, done.stdout[-2000:]
    analysis = analyze(run)
    shapes = convolution_shapes(read_op_costs(run))
    assert len(shapes) == 6  # the seed CNN's six convolutions
    steps = analysis.steps
    window = executions[(executions["at_ns"] >= steps["start_ns"].min()) & (executions["at_ns"] <= steps["end_ns"].max())]
    checked = []
    for op in analysis.ops[analysis.ops["kind"] == "matrix"].itertuples():
        base = re.sub(r"^_Mkl(Native)?", "", op.type).removesuffix("WithBias")
        prop = PROP.get("Conv2D" if "FusedConv2D" in base else base)
        shape = shapes.get(layer_scope(op.op))
        if prop is None or shape is None:
            continue
        if shape.split(",")[1] == "3" and prop == "backward_data":
            continue  # no gradient flows into the images
        mine = window[(window["prop"] == prop) & (window["shape"] == shape)]
        assert len(mine) >= 5, (op.op, prop, shape)
        flops_per_execution = op.flops_per_step / op.executions_per_step
        onednn_rate = flops_per_execution / (mine["ms"].mean() / 1e3)
        checked.append((op.op, prop, mine["impl"].iloc[0], op.flops_per_second, onednn_rate))
        assert op.flops_per_second == pytest.approx(onednn_rate, rel=0.10), checked[-1]
    # every convolution of the step, forward and backward (the first layer's images get no gradient)
    assert len(checked) == 6 + 5 + 6, checked
