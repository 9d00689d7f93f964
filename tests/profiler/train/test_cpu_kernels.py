"""TensorFlow's CPU kernels: `devprof run` turns oneDNN's on unless the user chose, run.json says
who chose, and the analysis names a CPU step that ran on Eigen's convolution kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.breakdown import ops as ops_mod
from profiler.device import devices
from repo_paths import REPO


def test_onednn_is_turned_on_only_where_the_user_did_not_choose():
    environ: dict[str, str] = {}
    devices.prefer_onednn(environ)
    on_x86 = devices.platform.machine().lower() in ("x86_64", "amd64")
    assert environ.get(devices.ONEDNN_VAR) == ("1" if on_x86 else None)
    assert devices.onednn_state(environ) == (
        {"onednn_opts": "1", "onednn_set_by": "devprof"} if on_x86 else {"onednn_opts": None, "onednn_set_by": None}
    )
    chosen = {devices.ONEDNN_VAR: "0"}
    devices.prefer_onednn(chosen)
    assert chosen == {devices.ONEDNN_VAR: "0"}
    assert devices.onednn_state(chosen) == {"onednn_opts": "0", "onednn_set_by": "user"}


def test_tensorflow_defaults_leave_both_cpu_choices_to_tensorflow():
    environ: dict[str, str] = {}
    devices.keep_tensorflow_defaults(environ)
    devices.prefer_onednn(environ)
    assert devices.ONEDNN_VAR not in environ
    assert devices.onednn_state(environ) == {"onednn_opts": None, "onednn_set_by": None}
    assert devices.cpu_inter_op_threads(environ, sockets=2) is None
    assert devices.cpu_inter_op_threads({}, sockets=2) == 2  # the control: devprof's choice without it


def _ops(types_ms: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "op": list(types_ms),
            "type": list(types_ms),
            "device": "/host:CPU",
            "count_per_step": 1.0,
            "ms_per_step": list(types_ms.values()),
            "compute_pct": 0.0,
        }
    )


def test_eigen_share_counts_dense_math_kernels_and_stays_silent_with_onednn():
    # The op types of the seed CNN's step on a 2-core AVX2 CPU, with and without oneDNN (ms per step).
    eigen = _ops(
        {
            "Conv2DBackpropInput": 270.3,
            "Conv2DBackpropFilter": 224.3,
            "_FusedConv2D": 70.0,
            "MaxPoolGrad": 33.1,
            "MatMul": 14.9,
            "Mul": 3.2,
        }
    )
    assert ops_mod.eigen_dense_pct(eigen) == pytest.approx(100 * (270.3 + 224.3 + 70.0 + 14.9) / 615.8)
    onednn = _ops(
        {
            "_MklNativeConv2DBackpropFilterWithBias": 134.1,
            "_MklNativeConv2DBackpropInput": 72.1,
            "MatMul": 3.0,
            "Mul": 1.4,
        }
    )
    assert pd.isna(ops_mod.eigen_dense_pct(onednn))
    assert pd.isna(ops_mod.eigen_dense_pct(_ops({})))


def _run(tmp_path: Path, name: str, onednn: str | None) -> tuple[dict, dict]:
    env = {k: v for k, v in os.environ.items() if k not in (devices.ONEDNN_VAR, "DEVPROF_SET_ONEDNN_OPTS")}
    if onednn is not None:
        env[devices.ONEDNN_VAR] = onednn
    env["PYTHONPATH"] = str(REPO)
    subprocess.run(
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
            "400",
            "--limit-test-images",
            "100",
            "--batch-size",
            "20",
            "--epochs",
            "1",
            "--profile-steps",
            "4:9",
            "--no-sample",
            "--out",
            str(tmp_path),
            "--run-name",
            name,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    meta = json.loads((tmp_path / name / "run.json").read_text())
    analysed = subprocess.run(
        [sys.executable, "-m", "profiler", "analyze", str(tmp_path / name), "--format", "json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return meta, json.loads(analysed.stdout)


@pytest.mark.slow
def test_a_run_on_eigens_kernels_is_told_to_turn_onednn_on(tmp_path):
    meta, result = _run(tmp_path, "eigen", "0")
    assert meta["device"]["onednn_opts"] == "0" and meta["device"]["onednn_set_by"] == "user"
    assert "cpu_without_onednn" in [f["rule"] for f in result["findings"]], result["findings"]
    assert any(op["type"] == "Conv2DBackpropInput" for op in result["ops"])

    meta, result = _run(tmp_path, "default", None)  # devprof's choice: oneDNN's kernels
    assert meta["device"]["onednn_opts"] == "1" and meta["device"]["onednn_set_by"] == "devprof"
    assert "cpu_without_onednn" not in [f["rule"] for f in result["findings"]]
    assert any(op["type"].startswith("_Mkl") for op in result["ops"])
