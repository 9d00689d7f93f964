"""Each finding rule fires on facts built to trigger it, stays silent on a clean run's facts, and
is documented; the facts themselves come from traces as the rules expect."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.breakdown.eager import EagerOps
from analysis.rules import facts as trace_facts
from analysis.rules import table as rules
from analysis.rules.facts import Facts
from analysis.rules.finding_rules import findings
from analysis.rules.rule import SEVERITIES
from repo_paths import REPO
from views import facts_from_mean, view_of

DOCS = REPO / "docs" / "rules.md"
MS = 1_000_000


def clean(**changes) -> Facts:
    """A compute-bound float32 run on a device without matrix units: no finding applies."""
    base = dict(
        input_pct=2.0,
        compute_pct=90.0,
        host_pct=8.0,
        device="gpu",
        precision="float32",
        other_cpu_pct=3.0,
        proc_cpu_pct=100.0,
        cpu_cores=2.0,
        prefetches=True,
        matrix_units=(),
        kernels_per_step=40.0,
        mean_kernel_us=900.0,
        idle_host_pct=5.0,
        device_mem_peak_bytes=4e9,
        device_mem_total_bytes=16e9,
    )
    base.update(changes)
    return dataclasses.replace(facts_from_mean({}), **base)


TRIGGERS: dict[str, dict[str, Any]] = {
    "cpu_contention": dict(other_cpu_pct=45.0, proc_cpu_pct=100.0, cpu_cores=2.0),
    "retracing": dict(retrace_steps=3, retrace_ms=120.0),
    "host_sync": dict(sync_name="MemcpyDtoH"),
    "launch_bound": dict(kernels_per_step=900.0, mean_kernel_us=6.0, idle_host_pct=55.0),
    "fp32_on_matrix_units": dict(matrix_units=("float16", "bfloat16")),
    "no_prefetch": dict(prefetches=False, input_wait_pct=6.0),  # said only where the host waits for the pipeline
    "eager_execution": dict(
        eager=EagerOps(op_time_pct=93.0, ms_per_step=40.0, step_pct=54.0, ops=(("LogicalAnd", 40.0),))
    ),
    "bf16_without_matrix_units": dict(precision="mixed_bfloat16", bfloat16_units=()),
    "memory_near_limit": dict(device_mem_peak_bytes=15.2e9, device_mem_total_bytes=16e9),
    "cpu_without_onednn": dict(device="cpu", eigen_dense_pct=77.0),
}


def test_a_clean_run_has_no_findings():
    assert findings(clean()) == []


@pytest.mark.parametrize("rule", sorted(TRIGGERS))
def test_each_rule_fires_alone_with_evidence_and_one_fix(rule):
    found = findings(clean(**TRIGGERS[rule]))
    assert [f["rule"] for f in found] == [rule]
    finding = found[0]
    assert finding["severity"] in SEVERITIES
    assert finding["evidence"] and finding["advice"]


def test_rules_read_the_numbers_they_are_given():
    assert "45 % of the machine's CPU" in findings(clean(**TRIGGERS["cpu_contention"]))[0]["evidence"]
    assert "3 steps after the first (120.0 ms)" in findings(clean(**TRIGGERS["retracing"]))[0]["evidence"]
    # From the datasheet alone (matrix units, no measured ceiling) the advice says it is a guess to measure.
    guess = findings(clean(**TRIGGERS["fp32_on_matrix_units"]))[0]
    assert "--precision mixed_bfloat16" in guess["advice"] and "devprof peak" in guess["advice"]
    assert guess["saving_ms"] is None and "guess" in guess["saving_basis"]
    measured = findings(clean(matrix_units=("float16",), matrix_ceilings=(("float16", 80e12), ("float32", 20e12))))
    assert "train with --precision mixed_float16 (float16 4.0x" in measured[0]["advice"]
    # Measured slower than float32: not advised at all.
    assert findings(clean(matrix_units=("float16",), matrix_ceilings=(("float16", 10e12), ("float32", 20e12)))) == []
    assert findings(clean(precision="mixed_float16", matrix_units=("float16",))) == []  # already uses them
    memory = findings(clean(**TRIGGERS["memory_near_limit"]))[0]
    assert memory["severity"] == "critical" and "95 %" in memory["evidence"]
    assert findings(clean(device_mem_peak_bytes=14.3e9)) == []  # 89 %: silent


def test_unknown_facts_keep_rules_silent():
    unknown = facts_from_mean(
        {"input_pct": 30.0, "compute_pct": 50.0, "host_pct": 20.0}
    )  # only the breakdown: nothing measured, nothing known
    assert findings(unknown) == []


def test_every_rule_is_documented():
    text = DOCS.read_text()
    for rule in rules.RULES:
        assert f"`{rule.id}`" in text, rule.id


# ---------------------------------------------------------------- facts from traces


def events(rows):
    frame = pd.DataFrame(rows, columns=["name", "plane_name", "line_name", "plane", "line", "start_ns", "end_ns"])
    frame["duration_ns"] = frame["end_ns"] - frame["start_ns"]
    frame["line_id"] = frame["line"]
    for column in ("name", "plane_name", "line_name"):
        frame[column] = frame[column].astype("category")
    return frame


STEPS = pd.DataFrame(
    {
        "step": [0, 1, 2],
        "steps": 1,
        "start_ns": [0, 10 * MS, 20 * MS],
        "end_ns": [10 * MS, 20 * MS, 30 * MS],
        "step_ms": 10.0,
        "compile_ms": [6.0, 0.0, 0.0],
    }
)


def test_retracing_counts_compiles_after_the_first_step_only():
    assert trace_facts.retracing(STEPS) == (0, 0.0)
    again = STEPS.assign(compile_ms=[6.0, 0.0, 4.0])
    assert trace_facts.retracing(again) == (1, 4.0)


def test_a_sync_in_every_step_is_found_and_one_in_some_steps_is_not():
    gpu = ("/device:GPU:0", "Stream #7(MemcpyDtoH)", 1, 3)
    every = events([("MemcpyDtoH", *gpu, k * 10 * MS + 8 * MS, k * 10 * MS + 9 * MS) for k in range(3)])
    assert trace_facts.syncs_in_every_step(view_of(every), STEPS) == "MemcpyDtoH"
    some = events([("MemcpyDtoH", *gpu, 8 * MS, 9 * MS)])
    assert trace_facts.syncs_in_every_step(view_of(some), STEPS) is None
    prints = events(
        [
            ("train/PrintV2:PrintV2", "/host:CPU", "python", 0, 0, k * 10 * MS + MS, k * 10 * MS + 2 * MS)
            for k in range(3)
        ]
    )
    assert trace_facts.syncs_in_every_step(view_of(prints), STEPS) == "train/PrintV2:PrintV2"


def test_the_calls_entry_and_exit_are_the_compute_before_its_first_op_and_after_its_last():
    from analysis.steps.host import call_entry_exit_ms

    # Each 10 ms step's call computes 9 ms; its ops (on an executor thread) run from 1.5 ms to 8 ms in: 2.5 ms of
    # the call is its own set-up and tear-down. Python before the call (the step's first 0.5 ms) is not compute.
    rows = [
        (name, "/host:CPU", "tf_Compute", 0, 1, k * 10 * MS + start, k * 10 * MS + end)
        for k in range(3)
        for name, start, end in (("dense/MatMul:MatMul", 1_500_000, 6 * MS), ("dense/Relu:Relu", 6 * MS, 8 * MS))
    ]
    steps = STEPS.assign(compute_ms=9.0)
    assert call_entry_exit_ms(view_of(events(rows)), steps) == pytest.approx(9.0 - 6.5)
    assert math.isnan(call_entry_exit_ms(view_of(events([("x", "/host:CPU", "python", 0, 0, 0, 1)])), steps))
    gpu = events(rows + [("fusion", "/device:GPU:0", "Stream #13(Compute)", 1, 2, 0, 5_000)])
    assert math.isnan(call_entry_exit_ms(view_of(gpu), steps))  # a device's steps compute on the device


def test_kernel_counts_and_lengths_leave_out_copies():
    gpu = ("/device:GPU:0", "Stream #13(Compute)", 1, 2)
    rows = [
        ("fusion", *gpu, k * 10 * MS + i * 100_000, k * 10 * MS + i * 100_000 + 5_000)
        for k in range(3)
        for i in range(50)
    ]
    rows += [("MemcpyH2D", *gpu, k * 10 * MS, k * 10 * MS + 2 * MS) for k in range(3)]
    per_step, mean_us = trace_facts.kernels(view_of(events(rows)), STEPS)
    assert per_step == 50 and mean_us == pytest.approx(5.0)
    assert all(
        math.isnan(v) for v in trace_facts.kernels(view_of(events([("x", "/host:CPU", "python", 0, 0, 0, 1)])), STEPS)
    )


@pytest.mark.parametrize(
    "device, expected",
    [
        ({"kind": "gpu", "gpus": [{"compute_capability": "8.0"}]}, ("float16", "bfloat16")),
        ({"kind": "gpu", "gpus": [{"compute_capability": "7.5"}]}, ("float16",)),
        ({"kind": "gpu", "gpus": [{"compute_capability": "6.1"}]}, ()),
        ({"kind": "tpu"}, ("bfloat16",)),
        ({"kind": "cpu", "matrix_units": ["bfloat16"]}, ("bfloat16",)),
        ({"kind": "cpu"}, None),
    ],
)
def test_matrix_units_from_the_device_facts(device, expected):
    assert trace_facts.matrix_unit_dtypes(device) == expected


def test_collective_wait_gives_its_own_verdict():
    mean = {
        "step_ms": 100.0,
        "input_ms": 1.0,
        "compute_ms": 70.0,
        "collective_ms": 25.0,
        "host_ms": 4.0,
        "input_pct": 1.0,
        "compute_pct": 70.0,
        "collective_pct": 25.0,
        "host_pct": 4.0,
    }
    verdict = rules.make_verdict(mean, facts_from_mean(mean), steps_used=5)
    # The kernels hold the step; the wait in all-reduce is its largest fix.
    assert verdict["bound"] == "compute" and verdict["first_fix"]["rule"] == "collective_bound"
    assert "collective wait 25.0 %" in verdict["evidence"] and "the others wait for" in verdict["advice"][0]
    waiting = {**mean, "compute_ms": 30.0, "collective_ms": 65.0, "compute_pct": 30.0, "collective_pct": 65.0}
    verdict = rules.make_verdict(waiting, facts_from_mean(waiting), steps_used=5)
    assert verdict["bound"] == "collective" and verdict["rule"] == "collective_bound" and verdict["level"] == "high"


def test_a_cpu_without_bfloat16_units_is_not_told_to_use_bfloat16():
    emulated = facts_from_mean(
        {
            "input_pct": 1.0,
            "compute_pct": 97.0,
            "host_pct": 2.0,
            "kind": "cpu",
            "precision": "float32",
            "bfloat16_units": [],
        }
    )
    verdict = rules.make_verdict(
        {
            "step_ms": 100.0,
            "input_ms": 1.0,
            "compute_ms": 97.0,
            "host_ms": 2.0,
            "input_pct": 1.0,
            "compute_pct": 97.0,
            "host_pct": 2.0,
        },
        emulated,
        steps_used=5,
    )
    text = " ".join(verdict["advice"]) + rules.fix_for("compute", emulated)
    assert verdict["bound"] == "compute" and "mixed_bfloat16" not in text.replace("so mixed_bfloat16", ""), text
    assert "no bfloat16 units" in " ".join(verdict["advice"])
    with_units = dataclasses.replace(emulated, bfloat16_units=("amx_bf16",))
    assert "--precision mixed_bfloat16" not in rules.fix_for("compute", with_units)  # flags alone: a guess
    measured = dataclasses.replace(with_units, matrix_ceilings=(("bfloat16", 2e12), ("float32", 1e12)))
    assert "--precision mixed_bfloat16" in rules.fix_for("compute", measured)


T0 = 1_700_000_000.0


def _idle_run(
    path: Path,
    *,
    idle: tuple[float, float],
    gap_after_step: int | None = None,
    gap_s: float = 0.0,
    validation_s: float = 0.5,
) -> Path:
    """Two epochs of ten 100 ms steps (epoch 1: 1.0 s of steps + `validation_s`; epoch 2 right after,
    1.0 s), a host sample every 0.5 s up to T0 + 15 s, the process at 100 % CPU except at 1 % over
    `idle` (seconds after T0); `gap_after_step` adds `gap_s` between that step and the next."""
    from analysis.read.run_files import STEPS_COLUMNS

    path.mkdir(parents=True)
    rows, t = [], T0
    for step in range(20):
        epoch = 1 if step < 10 else 2
        if step == 10:
            t += validation_s  # epoch 1's validation
        rows.append(f"{epoch},{step},1,{t:.6f},0.0,90.0,10.0,100.0,8")
        t += 0.1 + (gap_s if step == gap_after_step else 0.0)
    (path / "steps.csv").write_text("\n".join([",".join(STEPS_COLUMNS), *rows]) + "\n")
    second = T0 + 1.0 + validation_s + (gap_s if gap_after_step is not None and gap_after_step < 10 else 0.0)
    epochs = [
        {"epoch": 1, "seconds": second - T0, "start_time_s": T0, "images": 80},
        {"epoch": 2, "seconds": t - second, "start_time_s": second, "images": 80},
    ]
    meta = {
        "status": "complete",
        "config": {"batch_size": 8},
        "device": {"kind": "cpu", "name": "Test CPU"},
        "steps_per_epoch": 10,
        "epochs": epochs,
        "samplers": {"summaries": {}},
    }
    (path / "run.json").write_text(json.dumps(meta))
    times = T0 + np.arange(0, 30) * 0.5 + 0.5
    cpu = np.where((times > T0 + idle[0]) & (times <= T0 + idle[1]), 1.0, 100.0)
    (path / "utilization").mkdir()
    pd.DataFrame({"time_s": times, "cpu_pct": cpu / 2, "proc_cpu_pct": cpu, "proc_rss_bytes": 1e8}).to_csv(
        path / "utilization" / "host.csv", index=False
    )
    return path


def _idle_finding(run: Path) -> dict | None:
    import analysis

    found = [f for f in analysis.analyze(run).findings if f["rule"] == "idle_stretch"]
    return found[0] if found else None


# ---------------------------------------------------------------- an idle stretch outside steps


def test_an_idle_stretch_after_the_last_epoch_is_a_finding_with_its_length_and_place(tmp_path):
    finding = _idle_finding(_idle_run(tmp_path / "run", idle=(3.0, 13.0)))
    assert finding is not None and finding["severity"] == "warning"
    assert finding["evidence"].startswith(
        "The process sat idle for 10.0 s after the last epoch (2): its CPU stayed under 5 % (proc_cpu_pct)"
    ), finding["evidence"]


def test_an_idle_stretch_between_steps_and_before_evaluation_are_placed(tmp_path):
    run = _idle_run(tmp_path / "between", idle=(0.5, 4.0), gap_after_step=4, gap_s=3.0)
    finding = _idle_finding(run)
    assert finding is not None
    # idle from 0.5 s to 4.0 s, of which steps 0-4 (to 0.5 s) and 5 on (from 3.5 s) are work: 3.0 s idle
    assert "idle for 3.0 s between steps 4 and 5 (epoch 1)" in finding["evidence"], finding["evidence"]
    run = _idle_run(tmp_path / "validation", idle=(1.0, 3.5), validation_s=3.0)  # epoch 1 validates 1.0-4.0 s
    finding = _idle_finding(run)
    assert finding is not None
    assert "idle for 2.5 s after the last step of epoch 1 (step 9), before its evaluation ends" in finding["evidence"]


def test_short_idle_and_idle_inside_steps_are_no_finding(tmp_path):
    assert _idle_finding(_idle_run(tmp_path / "short", idle=(3.0, 4.5))) is None  # 1.5 s: under 2 s
    assert _idle_finding(_idle_run(tmp_path / "in-steps", idle=(0.0, 1.0))) is None  # inside steps 0-9
