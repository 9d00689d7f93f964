"""The roofline's convolution rates against oneDNN's own: a short CPU run of the seed CNN with
`--onednn-kernels` (oneDNN's log of each primitive execution, with its own time and a wall-clock
stamp, kept in the run).

Each convolution op's executions in the steady steps are laid on oneDNN's log by time (the
trace's clock starts at the capture's `profile_start_time`); oneDNN's time for the op is the sum
of the primitives it ran inside them (its convolution, and the reorders of its weights). The rate
that gives must agree with devprof's achieved FLOP/s within 10 % (the median over the executions:
one preempted between two primitives on a busy machine is an outlier), and the convolution it ran
must be the one its op type and recorded shapes say (forward, backward data or backward weights,
of that layer's channels and image size).

Batch 256: TensorFlow spends 0.3-0.5 ms of each op call outside oneDNN's primitives (setting the
primitive up, allocating its output), which is a tenth of the first layer's convolution at batch
128 (measured: oneDNN's time 0.86-0.90 of the op's there, 0.95-1.0 for the other convolutions)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import cast

import numpy as np
import pandas as pd
import pytest

from analysis import analyze
from analysis.read.inputs import read_inputs
from analysis.read.op_costs import read_op_costs
from analysis.read.trace import plane_metadata
from analysis.steps.host import steady_steps
from repo_paths import REPO

# onednn_verbose,v1,<ms since the epoch>,primitive,exec,cpu,<primitive>,<impl>,<prop>,<mds>,<attrs>,<aux>,<desc>,<ms>
EXEC = re.compile(
    r"^onednn_verbose,v\d+,(?P<at>[\d.]+),primitive,exec,cpu,(?P<primitive>[^,]*),(?P<impl>[^,]*),"
    r"(?P<prop>[^,]*),.*,(?P<desc>[^,]*),(?P<ms>[\d.]+)$"
)
DESC = re.compile(r"mb(?P<n>\d+)_ic(?P<ic>\d+)oc(?P<oc>\d+)_ih(?P<ih>\d+)")
PROP = {
    "Conv2D": "forward_training",
    "Conv2DBackpropInput": "backward_data",
    "Conv2DBackpropFilter": "backward_weights",
}


def onednn_executions(stdout: str) -> pd.DataFrame:
    rows = []
    for line in stdout.splitlines():
        found = EXEC.match(line.strip())
        if found:
            shape = DESC.search(found["desc"])
            rows.append(
                {
                    "at_ns": float(found["at"]) * 1e6,
                    "primitive": found["primitive"],
                    "impl": found["impl"],
                    "prop": found["prop"],
                    "ms": float(found["ms"]),
                    "shape": ",".join(shape[k] for k in ("n", "ic", "oc", "ih")) if shape else "",
                }
            )
    return pd.DataFrame(rows).sort_values("at_ns", kind="stable").reset_index(drop=True)


def convolution_shapes(costs: pd.DataFrame) -> dict[str, str]:
    """Layer scope -> "batch,input channels,output channels,input height" (oneDNN's problem), from its
    forward Conv2D's recorded shapes in the training step."""
    training = set(costs.loc[costs["type"] == "Conv2DBackpropFilter", "function"])  # not the evaluation step's
    shapes = {}
    for row in costs[(costs["type"] == "Conv2D") & costs["function"].isin(training)].itertuples():
        image, kernel = ([int(d) for d in s.split("x")] for s in row.input_shapes.split(";"))
        shapes[row.op.rsplit("/", 1)[0]] = f"{image[0]},{kernel[2]},{kernel[3]},{image[1]}"
    return shapes


def layer_scope(op: str) -> str:
    return op.removeprefix("gradient_tape/").rsplit("/", 1)[0].removesuffix("/convolution")


@pytest.mark.slow
def test_convolution_rates_agree_with_onednns_own_times(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_VERBOSE", "ONEDNN_VERBOSE_TIMESTAMP")}
    env.update(TF_ENABLE_ONEDNN_OPTS="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "profiler",
            "run",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--limit-images",
            "1536",
            "--limit-test-images",
            "64",
            "--batch-size",
            "256",
            "--epochs",
            "1",
            "--profile-steps",
            "2:6",
            "--no-sample",
            "--out",
            str(tmp_path),
            "--run-name",
            "r",
            "--onednn-kernels",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # oneDNN's lines went to the run's log; the rest of stdout is there
    assert "onednn_verbose," not in done.stdout and "Epoch 1/1" in done.stdout
    run = tmp_path / "r"
    recorded = json.loads((run / "run.json").read_text())["profiler"]["onednn_verbose"]
    assert recorded["lines"] > 0 and not recorded["capped"]
    executions = onednn_executions((run / "onednn_verbose.log").read_text())
    assert (executions["primitive"] == "convolution").any()
    analysis = analyze(run)
    shapes = convolution_shapes(read_op_costs(run))
    assert len(shapes) == 6  # the seed CNN's six convolutions
    inputs = read_inputs(run)
    assert inputs.trace is not None
    environment = next(p for p in plane_metadata(inputs.trace.trace) if p.name == "Task Environment")
    origin_ns = int(cast(int, environment.stats["profile_start_time"]))  # a uint64 stat
    steady = steady_steps(analysis.steps)
    host, at = inputs.trace.host, executions["at_ns"].to_numpy()
    checked = []
    for op in analysis.ops[analysis.ops["kind"] == "matrix"].itertuples():
        base = re.sub(r"^_Mkl(Native)?", "", op.type).removesuffix("WithBias")
        prop = PROP.get("Conv2D" if "FusedConv2D" in base else base)
        if prop is None:
            continue  # the dense layers' matmuls
        events = host[host["name"].astype(str) == f"{op.op}:{op.type}"]
        index = np.searchsorted(steady["start_ns"].to_numpy(), events["start_ns"].to_numpy(), side="right") - 1
        inside = (index >= 0) & (events["start_ns"].to_numpy() < steady["end_ns"].to_numpy()[np.clip(index, 0, None)])
        events = events[inside]
        assert len(events) == len(steady), (op.op, len(events), len(steady))
        first = np.searchsorted(at, events["start_ns"].to_numpy() + origin_ns)
        last = np.searchsorted(at, events["end_ns"].to_numpy() + origin_ns)
        ran = executions.iloc[np.concatenate([np.arange(a, b) for a, b in zip(first, last)])]
        convolutions = ran[ran["primitive"] == "convolution"]
        # one convolution per execution, the one the op type and its layer's recorded shapes name
        assert len(convolutions) == len(events), (op.op, convolutions)
        assert set(convolutions["prop"]) == {prop} and set(convolutions["shape"]) == {shapes[layer_scope(op.op)]}, (
            op.op,
            set(convolutions["prop"]),
            set(convolutions["shape"]),
        )
        # devprof's rate is the op's FLOPs over its time in the trace ...
        flops_per_execution = op.flops_per_step / op.executions_per_step
        op_seconds = (events["end_ns"] - events["start_ns"]).to_numpy() / 1e9
        assert op.flops_per_second == pytest.approx(flops_per_execution * len(events) / op_seconds.sum(), rel=1e-3)
        # ... and, execution by execution, oneDNN's own time for the same work gives the same rate. The
        # median: a thread a busy machine preempts between two primitives is one execution's outlier.
        onednn_seconds = np.array([executions["ms"].iloc[a:b].sum() / 1e3 for a, b in zip(first, last)])
        ratio = float(np.median(onednn_seconds / op_seconds))  # devprof's rate over oneDNN's
        checked.append((op.op, prop, convolutions["impl"].iloc[0], op.flops_per_second, ratio))
        assert ratio == pytest.approx(1.0, rel=0.10), checked[-1]
        # the op table names the implementation oneDNN's log gives for the convolution it ran
        assert op.kernel == f"oneDNN {convolutions['impl'].mode().iloc[0]}", (op.op, op.kernel)
    # every convolution of the step, forward and backward (the first layer's images get no gradient)
    assert len(checked) == 6 + 5 + 6, checked
