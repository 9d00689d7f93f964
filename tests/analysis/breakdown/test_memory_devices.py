"""Memory on every device and worker: PJRT's allocators (named by device, their reserved stack bytes),
every worker of a job, what holds a peak and the advice for it, the headroom a host allocator really
has, and an allocator's own lifetime peak. Synthetic traces with numbers worked out by hand; XProf's
Memory Profile tool is the oracle for the peaks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis
from analysis import analyze
from analysis.breakdown import memory_allocators as allocators
from analysis.breakdown import memory_holders
from memory_fixtures import GPU, UINT8, MiB, write_memory_trace, write_pjrt_memory_trace
from profiler.cli import main

SESSION = "2030_01_01_00_00_00"


# ---------------------------------------------------------------- PJRT (JAX on TPUs)


@pytest.fixture(scope="module")
def pjrt(tmp_path_factory):
    return write_pjrt_memory_trace(
        tmp_path_factory.mktemp("pjrt") / "plugins" / "profile" / SESSION / "tpu-host.xplane.pb"
    )


def test_pjrt_allocators_are_named_by_device_and_peak_with_their_reserved_bytes(pjrt):
    memory = analyze(pjrt.path).memory
    assert memory is not None
    peaks = {peak.name: peak for peak in memory.allocators}
    assert set(peaks) == {"TPU_0", "TPU_1"}
    for name, peak in peaks.items():
        assert peak.peak_bytes == pjrt.peak_bytes[name]  # heap + the stack reserved at that moment
        assert peak.capacity_bytes == pjrt.capacity_bytes
        regions = dict(peak.by_region)
        assert regions[allocators.RESERVED] == pjrt.reserved_at_peak[name]
        assert regions[allocators.BEFORE_WINDOW] == 64 * 1024  # the buffer freed at 6 ms, allocated before
        assert peak.lifetime_peak_bytes == pjrt.lifetime_peak_bytes[name] and not peak.lifetime_above_window
    # the larger argument's device first
    assert [peak.name for peak in memory.allocators] == ["TPU_1", "TPU_0"]


def test_pjrt_peaks_equal_xprofs_memory_profile_to_the_byte(pjrt):
    from xprof_oracle import xprof_memory_profile

    theirs = xprof_memory_profile(pjrt.path)  # XProf names PJRT's allocators by their index on the host
    ours = {peak.name: peak for peak in analyze(pjrt.path).memory.allocators}
    assert {f"TPU_{index}": (p["peak_bytes"], p["capacity_bytes"]) for index, p in theirs.items()} == {
        name: (peak.peak_bytes, int(peak.capacity_bytes)) for name, peak in ours.items()
    }
    stack = {f"TPU_{index}": dict(p["live"]).get("stack") for index, p in theirs.items()}
    assert stack == {name: dict(peak.by_region)[allocators.RESERVED] for name, peak in ours.items()}


def test_pjrt_reserved_bytes_are_said_as_such_in_the_text(pjrt, capsys, tmp_path):
    assert main(["analyze", str(pjrt.path), "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "TPU_0: peak 401.1 MiB of 1.00 GiB (39 %)" in text
    assert "300.0 MiB reserved by the allocator (stack and scratch" in text
    assert "(no op named)" in text and "None" not in text.split("memory (")[1]


# ---------------------------------------------------------------- every worker of a job


def _worker(job, index: int, extra_bytes: int):
    from compare_fixtures import make_run

    run = make_run(job, f"worker-{index}", epoch_seconds=(1.0,), steps=3, images=8, batch_size=8)
    meta = json.loads((run / "run.json").read_text())
    meta["worker"] = {"index": index, "count": 2}
    (run / "run.json").write_text(json.dumps(meta))
    return write_memory_trace(
        run / "plugins" / "profile" / SESSION / f"host-{index}.xplane.pb", extra_bytes=extra_bytes, capacity=64 * MiB
    )


@pytest.fixture(scope="module")
def memory_job(tmp_path_factory):
    job = tmp_path_factory.mktemp("job") / "job"
    job.mkdir()
    traces = [_worker(job, 0, 3 * MiB), _worker(job, 1, 20 * MiB)]
    (job / "run.json").write_text(
        json.dumps({"status": "complete", "workers": ["worker-0", "worker-1"], "num_workers": 2})
    )
    return job, traces


def test_every_workers_memory_is_in_the_json_named_by_worker(memory_job):
    job, traces = memory_job
    document = analyze(job).to_json()["memory"]
    workers = document["workers"]
    assert [w["worker"] for w in workers] == [0, 1]
    for worker, trace in zip(workers, traces):
        gpu = next(a for a in worker["allocators"] if a["name"] == GPU)
        assert gpu["peak_bytes"] == trace.peak_bytes
        # the same allocator shape as memory.allocators, steps included
        assert set(gpu) == set(document["allocators"][0]) and len(gpu["steps"]) == 3
    # memory.allocators stays the first worker's
    assert next(a for a in document["allocators"] if a["name"] == GPU)["peak_bytes"] == traces[0].peak_bytes
    assert traces[1].peak_bytes == traces[0].peak_bytes + 17 * MiB


def test_every_workers_memory_is_in_the_text_html_and_summary(memory_job, capsys, tmp_path):
    job, traces = memory_job
    out = tmp_path / "out"
    assert main(["analyze", str(job), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "every worker's allocators (the lines above are worker 0's):" in text
    assert "worker 1: GPU_0_bfc 28.0 MiB of 64.0 MiB (44 %)" in text
    page = (out / "report.html").read_text()
    assert "<h3>Every worker</h3>" in page and "worker 1: GPU_0_bfc 28.0 MiB of 64.0 MiB (44 %)" in page
    assert main(["analyze", str(job), "--format", "summary"]) == 0
    summary = json.loads(capsys.readouterr().out)["memory"]
    assert summary["fullest_worker"] == {
        "worker": 1,
        "allocator": GPU,
        "peak_bytes": traces[1].peak_bytes,
        "capacity_bytes": 64 * MiB,
    }


def test_a_single_runs_memory_workers_is_its_own_allocators(tmp_path):
    trace = write_memory_trace(tmp_path / "plugins" / "profile" / SESSION / "h.xplane.pb")
    document = analyze(trace.path).to_json()["memory"]
    assert document["workers"] == [{"worker": None, "allocators": document["allocators"]}]


# ---------------------------------------------------------------- what holds the memory


def _holder_finding(tmp_path, batch: float = 8, holder_op_ms: float = math.nan, **options) -> dict | None:
    import dataclasses

    from analysis.breakdown.memory import MemoryReport
    from analysis.breakdown.memory_allocators import allocator_report
    from analysis.read.trace import read_trace
    from analysis.read.view import TraceView
    from analysis.rules import finding_rules
    from views import facts_from_mean

    trace = write_memory_trace(tmp_path / "t.xplane.pb", **options)
    view = TraceView(read_trace(trace.path))
    steps = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "start_ns": [view.window[0] + (9 + 10 * k) * 1_000_000 for k in range(3)],
            "end_ns": [view.window[0] + (19 + 10 * k) * 1_000_000 for k in range(3)],
        }
    )
    peaks, timeline, per_step = allocator_report(view.memory, steps, view.window[0], batch)
    facts = dataclasses.replace(
        facts_from_mean({"input_pct": 2.0, "compute_pct": 90.0, "host_pct": 8.0}),
        memory=MemoryReport(peaks, timeline, per_step, (), batch),
        producer="devprof",
        device="gpu",
        holder_op_ms=holder_op_ms,
        step_ms=10.0,
    )
    return next((f for f in finding_rules.findings(facts) if f["rule"] == "memory_one_holder"), None)


def test_a_convolution_workspace_is_named_and_advised_as_one(tmp_path):
    found = _holder_finding(
        tmp_path,
        extra_op="model/conv2/Conv2D",
        extra_bytes=40 * MiB,
        extra_shape="[41943040]",
        extra_dtype=UINT8,
        extra_region="temp",
        capacity=256 * MiB,
    )
    assert found is not None
    assert found["evidence"].startswith(
        "model/conv2/Conv2D holds 40.0 MiB of GPU_0_bfc's 48.0 MiB peak (83 %) as scratch workspace"
    )
    assert "TF_CUDNN_WORKSPACE_LIMIT_IN_MB" in found["advice"] and "made once" not in found["advice"]


def test_a_batch_sized_tensor_is_advised_a_smaller_batch(tmp_path):
    found = _holder_finding(
        tmp_path, extra_op="model/big/MatMul", extra_bytes=40 * MiB, extra_shape="[8,1310720]", capacity=256 * MiB
    )
    assert found is not None and "in tensors that grow with the batch: [8,1310720] float (output)" in found["evidence"]
    assert "grow with the batch" in found["advice"] and "--batch-size" in found["advice"]
    assert "made once" not in found["advice"]


def test_a_fixed_tensor_made_every_step_is_advised_to_be_made_once(tmp_path):
    found = _holder_finding(tmp_path, extra_bytes=40 * MiB, capacity=256 * MiB)
    assert found is not None and "in tensors of a fixed size" in found["evidence"]
    assert "made once outside the step" in found["advice"]


def test_a_fixed_tensor_made_in_every_step_saves_its_ops_time_made_once(tmp_path):
    every = _holder_finding(tmp_path, extra_step="every", extra_bytes=40 * MiB, capacity=256 * MiB, holder_op_ms=3.5)
    assert every is not None and every["saving_ms"] == pytest.approx(3.5) and every["saving_pct"] == pytest.approx(35.0)
    assert "made the tensor in all 3 traced steps" in every["saving_basis"]
    # made in one step of three: no step time to save by making it once
    once = _holder_finding(tmp_path, extra_bytes=40 * MiB, capacity=256 * MiB, holder_op_ms=3.5)
    assert once is not None and once["saving_ms"] is None
    # a batch-sized holder: the fix is about memory, not time
    batch = _holder_finding(
        tmp_path,
        extra_step="every",
        extra_op="model/big/MatMul",
        extra_bytes=40 * MiB,
        extra_shape="[8,1310720]",
        capacity=256 * MiB,
        holder_op_ms=3.5,
    )
    assert batch is not None and batch["saving_ms"] is None


def test_without_a_batch_size_a_holder_is_not_called_fixed(tmp_path):
    found = _holder_finding(tmp_path, batch=math.nan, extra_bytes=40 * MiB, capacity=256 * MiB)
    assert found is not None and "fixed size" not in found["evidence"]
    assert "no batch size is known" in found["advice"]


def test_a_holder_under_one_percent_of_the_capacity_raises_nothing(tmp_path):
    # 16 MiB of a 24 MiB peak (67 %), but 0.8 % of a 2 GiB allocator
    assert _holder_finding(tmp_path, extra_bytes=16 * MiB, capacity=2048 * MiB) is None
    assert _holder_finding(tmp_path, extra_bytes=16 * MiB, capacity=1024 * MiB) is not None  # 1.6 %


@pytest.mark.parametrize(
    "op, shapes, regions, dtypes, batch, kind",
    [
        (
            "model/conv/Conv2D",
            ["[60162048]", "[8,128,26,27]"],
            ["temp", "output"],
            ["uint8", "float"],
            8.0,
            "workspace",
        ),
        (
            "model/conv/Conv2D",
            ["[60162048]", "[32,128,26,27]"],
            ["temp", "output"],
            ["uint8", "float"],
            32.0,
            "workspace",
        ),
        ("model/dense/MatMul", ["[32,4096,1024]"], ["output"], ["float"], 32.0, "batch"),
        ("Fill", ["[16777216]"], ["output"], ["float"], 32.0, "fixed"),
        ("Fill", ["[16777216]"], ["output"], ["float"], math.nan, "tensor"),
        ("Conv2D", ["[32,64,53,54]", "[32,128,26,27]"], ["output", "output"], ["float", "float"], math.nan, "op_type"),
        ("Conv2D", ["[32,64,53,54]", "[32,128,26,27]"], ["output", "output"], ["float", "float"], 32.0, "batch"),
    ],
)
def test_holder_kind_by_most_of_its_bytes(op, shapes, regions, dtypes, batch, kind):
    sizes = [
        float(np.prod([int(d) for d in s.strip("[]").split(",")])) * (1 if t == "uint8" else 4)
        for s, t in zip(shapes, dtypes)
    ]
    tensors = pd.DataFrame({"shape": shapes, "region": regions, "dtype": dtypes, "allocation_bytes": sizes})
    assert memory_holders.holder_kind(op, tensors, batch) == kind


# ---------------------------------------------------------------- a host allocator's headroom


def _host_run(root, sampled: bool):
    run = root / ("sampled" if sampled else "unsampled")
    write_memory_trace(
        run / "plugins" / "profile" / SESSION / "h.xplane.pb",
        allocator="mklcpu",
        capacity=24 * 2**30,
        fragmentation=0.0,
    )
    (run / "run.json").write_text(
        json.dumps(
            {
                "status": "complete",
                "config": {"batch_size": 8, "precision": "float32"},
                "device": {"kind": "cpu", "name": "Test CPU", "memory_bytes": 24 * 2**30},
            }
        )
    )
    if sampled:
        (run / "utilization").mkdir()
        times = 1_700_000_000 + np.arange(0.0, 4.0, 0.5)
        pd.DataFrame(
            {
                "time_s": times,
                "cpu_pct": 50.0,
                "proc_rss_bytes": 44 * MiB,
                "mem_used_bytes": 20 * 2**30,
                "mem_available_bytes": np.where(times > times[2], 40 * MiB, 4 * 2**30),
            }
        ).to_csv(run / "utilization" / "host.csv", index=False)
    return run


def test_a_host_allocators_headroom_is_the_memory_available_not_the_whole_ram(tmp_path):
    document = analyze(_host_run(tmp_path, sampled=True)).to_json()["memory"]
    cpu = next(a for a in document["allocators"] if a["name"] == "mklcpu")
    # 4 MiB + 512 bytes of the 11 MiB peak grow with the batch of 8; the machine had 40 MiB free at its least
    assert cpu["batch_bytes"] == 4 * MiB + 512
    assert cpu["max_batch"] == math.floor(8 * (4 * MiB + 512 + 40 * MiB) / (4 * MiB + 512)) == 87
    assert cpu["headroom_basis"] == "available_memory" and cpu["headroom_reason"] is None
    assert "40.0 MiB available at its least" in cpu["headroom"] and "4.0x this allocator's peak" in cpu["headroom"]


def test_a_host_allocators_headroom_without_samplers_is_unknown_with_a_reason(tmp_path, capsys):
    run = _host_run(tmp_path, sampled=False)
    cpu = next(a for a in analyze(run).to_json()["memory"]["allocators"] if a["name"] == "mklcpu")
    assert cpu["max_batch"] is None and cpu["headroom_basis"] is None
    assert "shared with every other process" in cpu["headroom_reason"]
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 0
    assert "headroom: unknown: this allocator draws on the machine's memory" in capsys.readouterr().out


def test_a_device_allocators_headroom_is_against_its_capacity(tmp_path):
    run = tmp_path / "gpu"
    write_memory_trace(run / "plugins" / "profile" / SESSION / "h.xplane.pb")
    (run / "run.json").write_text(json.dumps({"status": "complete", "config": {"batch_size": 8}}))
    gpu = next(a for a in analyze(run).to_json()["memory"]["allocators"] if a["name"] == GPU)
    assert gpu["headroom_basis"] == "allocator_capacity" and gpu["max_batch"] == 15


# ---------------------------------------------------------------- the lifetime peak


def test_a_lifetime_peak_near_capacity_before_the_window_is_said(tmp_path, capsys):
    import dataclasses

    from analysis.breakdown.memory import MemoryReport
    from analysis.breakdown.memory_allocators import allocator_report
    from analysis.read.trace import read_trace
    from analysis.read.view import TraceView
    from analysis.rules import finding_rules
    from views import facts_from_mean

    trace = write_memory_trace(
        tmp_path / "plugins" / "profile" / SESSION / "h.xplane.pb", lifetime_peak=int(15.9 * MiB)
    )
    view = TraceView(read_trace(trace.path))
    peaks, timeline, per_step = allocator_report(
        view.memory, pd.DataFrame(columns=["step", "start_ns", "end_ns"]), view.window[0], 8
    )
    gpu = next(p for p in peaks if p.name == GPU)
    assert gpu.peak_bytes == 11 * MiB + 512 and gpu.lifetime_peak_bytes == int(15.9 * MiB) and gpu.lifetime_above_window
    facts = dataclasses.replace(
        facts_from_mean({"input_pct": 2.0, "compute_pct": 90.0, "host_pct": 8.0}),
        memory=MemoryReport(peaks, timeline, per_step, (), 8),
        device="gpu",
    )
    near = next(f for f in finding_rules.findings(facts) if f["rule"] == "memory_near_capacity")
    assert "peaked at 11.0 MiB of its 16.0 MiB (69 %)" in near["evidence"]
    assert "before the traced window it had held 15.9 MiB (99.4 % of its capacity)" in near["evidence"]
    assert main(["analyze", str(trace.path), "--out", str(tmp_path / "out")]) == 0
    text = " ".join(capsys.readouterr().out.split())  # long lines are wrapped
    assert "its own lifetime peak, before the window, was 15.9 MiB (99.4 %)" in text
    document = analyze(trace.path).to_json()["memory"]
    assert next(a for a in document["allocators"] if a["name"] == GPU)["lifetime_peak_bytes"] == int(15.9 * MiB)


def test_a_lifetime_peak_below_the_windows_is_not_said(tmp_path):
    trace = write_memory_trace(tmp_path / "h.xplane.pb", lifetime_peak=MiB)
    peak = next(p for p in analyze(trace.path).memory.allocators if p.name == GPU)
    assert not peak.lifetime_above_window and peak.lifetime_peak_bytes == peak.peak_bytes


def test_a_fixed_tensor_made_every_step_is_found_for_its_time_under_half_the_peak(tmp_path):
    # 6 MiB of a 14 MiB peak (43 %, under half), but made in every step, its op taking 2 of 10 ms: worth making once
    found = _holder_finding(tmp_path, extra_step="every", extra_bytes=6 * MiB, capacity=256 * MiB, holder_op_ms=2.0)
    assert found is not None and found["saving_ms"] == pytest.approx(2.0)
    assert (
        _holder_finding(tmp_path, extra_step="every", extra_bytes=6 * MiB, capacity=256 * MiB, holder_op_ms=0.2) is None
    )  # 2 % of the step: no finding under half the peak


def test_a_capacity_below_the_peak_or_a_fragmentation_outside_0_1_is_not_stated(tmp_path):
    from analysis.breakdown.memory_allocators import allocator_report
    from analysis.read.trace import read_trace
    from analysis.read.view import TraceView

    trace = write_memory_trace(tmp_path / "t.xplane.pb", capacity=4 * MiB, fragmentation=-3.0)  # peak 11 MiB
    view = TraceView(read_trace(trace.path))
    peaks, _, _ = allocator_report(view.memory, pd.DataFrame(columns=["step", "start_ns", "end_ns"]), view.window[0], 8)
    gpu = next(p for p in peaks if p.name == GPU)
    assert math.isnan(gpu.capacity_bytes) and math.isnan(gpu.capacity_share) and math.isnan(gpu.fragmentation)


def _memory_run(root: Path, images: list[int]) -> Path:
    from memory_fixtures import write_memory_trace

    run = root / "run"
    write_memory_trace(run / "plugins" / "profile" / "s" / "h.xplane.pb")
    (run / "run.json").write_text(json.dumps({"status": "complete", "config": {}}))  # profile(): no batch size
    rows = [f"1,{k},1,{1_700_000_000 + k:.6f},1.0,8.0,1.0,10.0,{n}" for k, n in enumerate(images)]
    (run / "steps.csv").write_text(
        "epoch,step,steps,start_time_s,input_ms,call_ms,other_host_ms,step_ms,images\n" + "\n".join(rows) + "\n"
    )
    return run


def test_the_images_every_step_recorded_are_the_batch_size_for_headroom(tmp_path):
    from memory_fixtures import GPU

    memory = analysis.analyze(_memory_run(tmp_path / "same", [8, 8, 8])).to_json()["memory"]
    gpu = next(a for a in memory["allocators"] if a["name"] == GPU)
    assert memory["batch_size"] == 8 and gpu["max_batch"] == 15  # as where run.json states batch 8
    # steps of different sizes (a last, partial batch) state no one batch size
    uneven = analysis.analyze(_memory_run(tmp_path / "uneven", [8, 8, 3])).to_json()["memory"]
    assert uneven["batch_size"] is None
    assert "steps.csv's images per step are not one number" in uneven["allocators"][0]["headroom_reason"]
