"""Where the memory goes: the allocators' events read once, each allocator's peak and what held it,
per step, the batch headroom, the memory findings and their outputs. Synthetic traces with numbers
worked out by hand (tests/support/memory_fixtures.py); XProf's Memory Profile tool is the oracle."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from analysis.read.trace import read_trace
from analysis.read.view import TraceView
from memory_fixtures import GPU, PINNED, MiB, write_memory_trace


@pytest.fixture(scope="module")
def memory_trace(tmp_path_factory):
    return write_memory_trace(tmp_path_factory.mktemp("memory") / "plugins" / "profile" / "s" / "memory-host.xplane.pb")


def test_the_allocator_events_are_read_once_into_one_table(memory_trace):
    view = TraceView(read_trace(memory_trace.path))
    memory = view.memory
    gpu = memory[memory["allocator"] == GPU]
    # 3 steps x (conv, temp, matmul, grad: 4 allocations and 4 frees) + the extra Fill and its free
    assert len(gpu) == 26 and len(memory[memory["allocator"] == PINNED]) == 6
    assert (np.diff(memory["start_ns"].to_numpy()) >= 0).all()
    first = gpu.iloc[0]
    assert first["allocation"] and first["op"] == "model/conv/Conv2D" and first["shape"] == "[8,64,32,32]"
    assert first["dtype"] == "float" and first["region"] == "output" and first["group_id"] == 0
    assert first["bytes_in_use"] == 4 * MiB + 2 * MiB and first["allocation_bytes"] == 2 * MiB
    assert first["bytes_available"] == memory_trace.capacity_bytes - 6 * MiB
    temp = gpu[gpu["shape"] == "[1048576]"].iloc[0]
    assert temp["dtype"] == "uint8" and temp["region"] == "temp"
    freed = gpu[~gpu["allocation"]].iloc[0]
    # a deallocation names no op, type or shape: empty, not made up
    assert freed["op"] == "" and freed["dtype"] == "" and freed["shape"] == "" and freed["address"] == 2000
    assert gpu["bytes_in_use"].max() == memory_trace.peak_bytes
    # the lifetime peak is the allocator's own stat, above the window's
    assert gpu["peak_bytes_in_use"].max() == 13 * MiB


def test_a_trace_without_allocator_events_has_an_empty_memory_table(tmp_path):
    from trace_fixtures import write_grouped_host_trace

    view = TraceView(read_trace(write_grouped_host_trace(tmp_path / "t.xplane.pb")))
    assert view.memory.empty and "bytes_in_use" in view.memory


def test_an_event_that_does_not_state_its_bytes_has_none_not_zero(tmp_path):
    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    host = _Plane(space, 0, "/host:CPU")
    line = host.line(1, "tf_Compute/1", 10**9)
    host.event(
        line,
        "MemoryAllocation",
        10**9 + 1,
        10**9 + 1,
        allocator_name="mklcpu",
        requested_bytes=4,
        allocation_bytes=256,
        tf_op="Cast",
    )
    host.event(
        line,
        "MemoryAllocation",
        10**9 + 5,
        10**9 + 5,
        allocator_name="mklcpu",
        bytes_allocated=512,
        bytes_reserved=0,
        allocation_bytes=256,
    )
    host.event(line, "ExecutorState::Process", 10**9, 10**9 + 9)
    host.finish()
    memory = TraceView(read_trace(_write_space(space, tmp_path / "t.xplane.pb"))).memory
    assert len(memory) == 2 and math.isnan(memory["bytes_in_use"].iat[0]) and math.isnan(memory["fragmentation"].iat[0])
    assert memory["bytes_in_use"].iat[1] == 512 and memory["op"].iat[0] == "Cast"


# ---------------------------------------------------------------- the breakdown


def _steps(trace, steps: int = 3):
    import pandas as pd

    from trace_fixtures import ABSOLUTE_BASE_NS

    starts = [ABSOLUTE_BASE_NS + (10 + 10 * k) * MS for k in range(steps)]
    return pd.DataFrame({"step": range(steps), "start_ns": starts, "end_ns": [s + 10 * MS - 100_000 for s in starts]})


MS = 1_000_000


def _report(trace, batch: float = 8, steps: int = 3):
    from analysis.breakdown.memory_allocators import allocator_report

    view = TraceView(read_trace(trace.path))
    return allocator_report(view.memory, _steps(trace, steps), view.window[0], batch)


def test_the_peak_what_holds_it_and_when_are_the_hand_worked_numbers(memory_trace):
    peaks, timeline, per_step = _report(memory_trace)
    gpu = next(p for p in peaks if p.name == GPU)
    # 4 MiB before the window + the 3 MiB Fill + two 2 MiB activations + 512 bytes of MatMul
    assert gpu.peak_bytes == memory_trace.peak_bytes == 11 * MiB + 512
    assert gpu.peak_step == 1 and gpu.peak_op == "gradient_tape/conv/Conv2DBackpropInput"
    assert gpu.peak_time_ms == pytest.approx(24.0)
    assert gpu.capacity_bytes == 16 * MiB and gpu.fragmentation == 0.25
    live = {(g.op, g.bytes) for g in gpu.top_at_peak}
    assert live == {
        (None, 4 * MiB),
        ("extra/Fill", 3 * MiB),
        ("model/conv/Conv2D", 2 * MiB),
        ("gradient_tape/conv/Conv2DBackpropInput", 2 * MiB),
        ("model/dense/MatMul", 512),
    }
    assert sum(g.bytes for g in gpu.top_at_peak) == gpu.peak_bytes  # what is live explains the peak exactly
    assert dict(gpu.by_region) == {"output": 7 * MiB + 512, "before the window": 4 * MiB}
    assert gpu.by_op[0] == ("extra/Fill", 3 * MiB)
    # per step: the peak in it and what it still holds at its end
    mine = per_step[per_step["allocator"] == GPU]
    assert mine["peak_bytes"].tolist() == [8 * MiB + 512, 11 * MiB + 512, 8 * MiB + 512]
    assert mine["end_bytes"].tolist() == [4 * MiB] * 3 and math.isnan(gpu.growth_bytes_per_step)
    pinned = next(p for p in peaks if p.name == PINNED)
    assert pinned.peak_bytes == 1024 + 256 and pinned.peak_step == 0  # reached in every step: the first
    assert len(timeline) == 32 and set(timeline["step"].dropna()) == {0, 1, 2}


def test_the_peak_per_allocator_and_what_is_live_at_it_equal_xprofs_memory_profile(memory_trace):
    from xprof_oracle import xprof_memory_profile

    theirs = xprof_memory_profile(memory_trace.path)
    peaks, _, _ = _report(memory_trace)
    assert (
        {p.name: p.peak_bytes for p in peaks}
        == {name: t["peak_bytes"] for name, t in theirs.items()}
        == {GPU: 11 * MiB + 512, PINNED: 1280}
    )
    gpu = next(p for p in peaks if p.name == GPU)
    assert gpu.capacity_bytes == theirs[GPU]["capacity_bytes"]
    # XProf names what the window did not allocate "unused preallocated device memory"
    ours = sorted((g.op or "unused preallocated device memory", g.bytes) for g in gpu.top_at_peak)
    assert ours == sorted(theirs[GPU]["live"])


def test_the_batch_headroom_splits_the_peak_by_the_batch_dimension(memory_trace):
    peaks, _, _ = _report(memory_trace, batch=8)
    gpu = next(p for p in peaks if p.name == GPU)
    assert gpu.batch_bytes == 4 * MiB + 512 and gpu.fixed_bytes == 7 * MiB
    # usable = peak + free x (1 - 0.25) = 15,466,624; (usable - fixed) x 8 / batch bytes = 15.5
    assert gpu.max_batch == memory_trace.max_batch == 15 and "0.25" not in gpu.headroom and "25.0 %" in gpu.headroom
    unknown = next(p for p in _report(memory_trace, batch=math.nan)[0] if p.name == GPU)
    assert math.isnan(unknown.batch_bytes) and math.isnan(unknown.max_batch) and unknown.headroom.startswith("unknown")
    other = next(p for p in _report(memory_trace, batch=16)[0] if p.name == GPU)  # no tensor has 16 first
    assert other.batch_bytes == 0 and math.isnan(other.max_batch) and "first dimension" in other.headroom


def test_a_capacity_is_unknown_where_neither_the_trace_nor_the_run_states_it():
    import pandas as pd

    from analysis.breakdown.memory_allocators import allocator_peak, stated_capacity

    events = pd.DataFrame(
        {
            "allocator": ["GPU_1_bfc"] * 2,
            "start_ns": [10, 20],
            "allocation": [True, False],
            "bytes_in_use": [1024.0, 0.0],
            "bytes_available": [math.nan] * 2,
            "fragmentation": [math.nan] * 2,
            "allocation_bytes": [1024.0] * 2,
            "address": [7.0] * 2,
            "op": ["a", ""],
            "shape": ["[4,64]", ""],
            "dtype": ["float", ""],
            "region": ["output", ""],
        }
    )
    steps = pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [100]})
    found = allocator_peak("GPU_1_bfc", events, steps, 4.0, stated_capacity("GPU_1_bfc", {}, None), 0)
    assert found is not None
    peak, _ = found
    assert math.isnan(peak.capacity_bytes) and math.isnan(peak.max_batch) and "no capacity" in peak.headroom
    assert peak.batch_bytes == 1024  # the split is known without a capacity
    gpu1 = pd.DataFrame({"time_s": [1.0], "mem_total_bytes": [8.0 * 2**30]})
    assert stated_capacity("GPU_1_bfc", {"gpu1": gpu1}, None) == (8.0 * 2**30, "gpu1.csv mem_total_bytes")


def test_each_steps_peak_counts_what_it_entered_with_and_its_end_is_the_last_value_before_it():
    import pandas as pd

    from analysis.breakdown.memory_allocators import step_table

    events = pd.DataFrame({"start_ns": [5, 10, 20, 30, 40, 50], "bytes_in_use": [1.0, 5, 3, math.nan, 7, 2]})
    steps = pd.DataFrame(
        {"step": range(6), "start_ns": [0, 12, 25, 41, 100, -20], "end_ns": [12, 25, 41, 60, 110, -10]}
    )
    table = step_table("a", events, steps, 0)
    # a step with no event holds what the one before left; one before every event is unknown, not 0
    assert table["peak_bytes"].tolist()[:5] == [5, 5, 7, 7, 2] and table["end_bytes"].tolist()[:5] == [5, 3, 7, 2, 2]
    assert math.isnan(table["peak_bytes"].iat[5]) and math.isnan(table["end_bytes"].iat[5])


def test_bytes_held_at_step_end_growing_step_after_step_is_growth(tmp_path):
    leaking = write_memory_trace(tmp_path / "leak.xplane.pb", steps=10, extra_step=None, leak_bytes=4096)
    peaks, _, per_step = _report(leaking, steps=10)
    gpu = next(p for p in peaks if p.name == GPU)
    assert per_step[per_step["allocator"] == GPU]["end_bytes"].tolist() == [4 * MiB + 4096 * (k + 1) for k in range(10)]
    assert gpu.growth_bytes_per_step == 4096 and gpu.growth_steps == 9
    # the kept tensors are live at the peak, in the last step
    assert gpu.peak_step == 9 and dict(gpu.by_op)["loss/Identity"] == 9 * 4096
    steady = write_memory_trace(tmp_path / "steady.xplane.pb", steps=10, extra_step=None)
    assert all(math.isnan(p.growth_bytes_per_step) for p in _report(steady, steps=10)[0])
    # too few steps to tell a leak from a plateau: not called one
    short = write_memory_trace(tmp_path / "short.xplane.pb", steps=6, extra_step=None, leak_bytes=4096)
    assert all(math.isnan(p.growth_bytes_per_step) for p in _report(short, steps=6)[0])


def test_memory_that_levels_off_is_not_a_leak():
    from analysis.breakdown.memory_allocators import growth_per_step

    mib = float(MiB)
    # a window of 5 calls: 434, 434, 500, 500, 502 MiB; over 14 the same program levels off at 502
    plateau = np.array([434, 434, 500, 500, 502, 502, 502, 503, 503, 503, 503, 503, 503, 503], dtype=float) * mib
    assert math.isnan(growth_per_step(plateau[:5])) and math.isnan(growth_per_step(plateau))
    leak = 434 * mib + 4 * mib * np.arange(14)
    assert growth_per_step(leak) == 4 * mib


def test_the_samplers_memory_over_the_run_and_its_growth_across_epochs():
    import pandas as pd

    from analysis.breakdown.memory import sampled_memory

    # four epochs of 10 s, sampled every 0.5 s; RSS ends them at 1.0, 1.2, 1.4, 1.6 GB; the machine has 8 GB
    times = np.arange(0.25, 40.0, 0.5)
    rss = 1.0e9 + np.floor(times / 10.0) * 0.2e9
    host = pd.DataFrame(
        {
            "time_s": times,
            "proc_rss_bytes": rss,
            "mem_used_bytes": 6e9,
            "mem_available_bytes": np.where(times > 30, 0.5e9, 2e9),
        }
    )
    gpu0 = pd.DataFrame({"time_s": times, "mem_used_bytes": 3e9, "mem_total_bytes": 16e9})
    steps = pd.DataFrame({"epoch": np.repeat([0, 1, 2, 3], 10), "start_time_s": np.arange(40) + 0.0, "step_ms": 1000.0})
    host_memory, gpu_memory = sampled_memory({"host": host, "gpu0": gpu0}, steps)
    assert host_memory.what == "process RSS" and host_memory.peak_bytes == 1.6e9
    assert host_memory.epoch_end_bytes == pytest.approx((1.0e9, 1.2e9, 1.4e9, 1.6e9))
    assert host_memory.growth_bytes_per_epoch == pytest.approx(0.2e9)
    # the last epoch did not grow: not growth
    flat_end = host.assign(proc_rss_bytes=np.minimum(rss, 1.4e9))
    assert math.isnan(sampled_memory({"host": flat_end}, steps)[0].growth_bytes_per_epoch)
    assert host_memory.min_available_bytes == 0.5e9 and host_memory.total_bytes == 8e9
    assert gpu_memory.what == "GPU memory used" and gpu_memory.total_bytes == 16e9
    assert math.isnan(gpu_memory.growth_bytes_per_epoch)
    assert sampled_memory({}, steps) == ()


# ---------------------------------------------------------------- findings


def _facts(trace, *, batch: float = 8, steps: int = 3, sampled=(), producer: str = "devprof"):
    import dataclasses

    from analysis.breakdown.memory import MemoryReport
    from views import facts_from_mean

    peaks, timeline, per_step = _report(trace, batch=batch, steps=steps)
    report = MemoryReport(peaks, timeline, per_step, tuple(sampled), batch)
    return dataclasses.replace(
        facts_from_mean({"input_pct": 2.0, "compute_pct": 90.0, "host_pct": 8.0}),
        memory=report,
        producer=producer,
        device="gpu",
    )


def _memory_findings(facts) -> dict:
    from analysis.rules import finding_rules

    return {f["rule"]: f for f in finding_rules.findings(facts) if "memory" in f["rule"]}


def test_a_peak_well_inside_its_capacity_gives_no_memory_finding(memory_trace):
    assert _memory_findings(_facts(memory_trace)) == {}


@pytest.mark.parametrize(
    "rule, trace_options",
    [
        ("memory_near_capacity", dict(capacity=12 * MiB, fragmentation=0.1)),  # 11 MiB of 12: 92 %
        ("memory_fragmentation", dict(fragmentation=0.4)),  # 69 % of the capacity, 40 % fragmented
        ("memory_growth", dict(steps=10, extra_step=None, leak_bytes=4096)),
        ("memory_one_holder", dict(extra_bytes=16 * MiB, capacity=64 * MiB)),  # the Fill: 16 of 24 MiB + 512
    ],
)
def test_each_memory_finding_fires_alone_on_the_trace_that_shows_it(tmp_path, rule, trace_options):
    trace = write_memory_trace(tmp_path / "t.xplane.pb", **trace_options)
    found = _memory_findings(_facts(trace, steps=trace_options.get("steps", 3)))
    assert list(found) == [rule]
    finding = found[rule]
    # they save no step time: no saving is claimed, and none enters the verdict
    assert finding["saving_ms"] is None and finding["saving_pct"] is None
    assert finding["evidence"] and finding["advice"]


def test_the_memory_findings_state_their_numbers_and_fix_in_the_programs_terms(tmp_path):
    near = write_memory_trace(tmp_path / "near.xplane.pb", capacity=12 * MiB, fragmentation=0.1)
    finding = _memory_findings(_facts(near))["memory_near_capacity"]
    assert finding["severity"] == "critical"
    assert "GPU_0_bfc peaked at 11.0 MiB of its 12.0 MiB (92 %) at step 1" in finding["evidence"]
    assert "gradient_tape/conv/Conv2DBackpropInput" in finding["evidence"]
    # 80 % of 12 MiB less the 7 MiB that do not grow, over 4 MiB + 512 per 8 images: 5 images
    assert "a batch of 5 (`--batch-size 5`)" in finding["advice"] and "tf.recompute_grad" in finding["advice"]
    keras = _memory_findings(_facts(near, producer="keras"))["memory_near_capacity"]["advice"]
    assert "`batch_size=5` in `fit`" in keras and "--batch-size" not in keras
    leak = write_memory_trace(tmp_path / "leak.xplane.pb", steps=10, extra_step=None, leak_bytes=4096)
    growth = _memory_findings(_facts(leak, steps=10))["memory_growth"]
    assert "by 4.0 KiB a step" in growth["evidence"] and "float(loss)" in growth["advice"]
    assert "at the end of each of 9 steps (the first left out)" in growth["evidence"]
    holder = write_memory_trace(tmp_path / "holder.xplane.pb", extra_bytes=16 * MiB, capacity=64 * MiB)
    one = _memory_findings(_facts(holder))["memory_one_holder"]
    assert one["evidence"].startswith(
        "extra/Fill holds 16.0 MiB of GPU_0_bfc's 24.0 MiB peak (67 %) in tensors of a "
        "fixed size, the same whatever the batch: [4194304] float (output)"
    )
    assert "made once outside the step" in one["advice"]  # its tensor does not grow with the batch


def test_host_memory_pressure_and_epoch_growth_come_from_the_samplers(memory_trace):
    from analysis.breakdown.memory import SampledMemory
    from analysis.rules import finding_rules

    tight = SampledMemory("host", "process RSS", "proc_rss_bytes", 1e9, 6e9, 6.5e9, 8e9, 0.4e9, (), math.nan)
    found = {f["rule"]: f for f in finding_rules.findings(_facts(memory_trace, sampled=[tight]))}
    assert list(found) == ["host_memory_pressure"]
    assert "fell to 381.5 MiB of 7.45 GiB (5 %)" in found["host_memory_pressure"]["evidence"]
    assert ".cache(filename)" in found["host_memory_pressure"]["advice"]
    roomy = SampledMemory("host", "process RSS", "proc_rss_bytes", 1e9, 1e9, 1e9, 8e9, 2e9, (1e9, 1.2e9, 1.4e9), 0.2e9)
    found = {f["rule"]: f for f in finding_rules.findings(_facts(memory_trace, sampled=[roomy]))}
    assert list(found) == ["memory_growth"] and "epoch after epoch" in found["memory_growth"]["evidence"]


# ---------------------------------------------------------------- outputs


def _run_dir(root):
    """A run directory around the memory trace: batch 8, three epochs of steps, a host sampler whose
    machine runs low on memory in the last epoch."""
    import json

    import pandas as pd

    run = root / "run"
    trace = write_memory_trace(run / "plugins" / "profile" / "s" / "memory-host.xplane.pb")
    (run / "run.json").write_text(
        json.dumps(
            {
                "status": "complete",
                "config": {"batch_size": 8, "precision": "float32"},
                "device": {"kind": "gpu", "name": "Test GPU", "gpus": [{"name": "Test GPU", "memory_bytes": 16 * MiB}]},
                "steps_per_epoch": 4,
                "epochs": [{"epoch": e, "seconds": 4.0, "images": 32} for e in (1, 2, 3)],
            }
        )
    )
    rows = [f"{e},{e * 4 + k},1,{1_700_000_000 + e * 4 + k:.6f},1.0,8.0,1.0,10.0,8" for e in range(3) for k in range(4)]
    (run / "steps.csv").write_text(
        "epoch,step,steps,start_time_s,input_ms,call_ms,other_host_ms,step_ms,images\n" + "\n".join(rows) + "\n"
    )
    (run / "utilization").mkdir()
    times = 1_700_000_000 + np.arange(0.0, 12.0, 0.5)
    pd.DataFrame(
        {
            "time_s": times,
            "cpu_pct": 50.0,
            "proc_cpu_pct": 100.0,
            "proc_rss_bytes": 2e9,
            "mem_used_bytes": 7.5e9,
            "mem_available_bytes": np.where(times > times[0] + 9, 0.3e9, 3e9),
        }
    ).to_csv(run / "utilization" / "host.csv", index=False)
    return run, trace


def test_analyze_reports_the_memory_in_json_csv_text_and_html(tmp_path, capsys):
    import json

    import pandas as pd

    from analysis import analyze
    from profiler.cli import main

    run, trace = _run_dir(tmp_path)
    result = analyze(run)
    assert result.memory is not None and result.memory.batch_size == 8
    document = result.to_json()["memory"]
    gpu = document["allocators"][0]
    assert {
        key: gpu[key]
        for key in (
            "name",
            "peak_bytes",
            "peak_step",
            "peak_op",
            "capacity_bytes",
            "fragmentation",
            "batch_bytes",
            "fixed_bytes",
            "max_batch",
        )
    } == {
        "name": GPU,
        "peak_bytes": 11 * MiB + 512,
        "peak_step": 1,
        "peak_op": "gradient_tape/conv/Conv2DBackpropInput",
        "capacity_bytes": 16 * MiB,
        "fragmentation": 0.25,
        "batch_bytes": 4 * MiB + 512,
        "fixed_bytes": 7 * MiB,
        "max_batch": 15,
    }
    assert gpu["top_at_peak"][0] == {
        "op": None,
        "shape": None,
        "dtype": None,
        "region": "before the window",
        "bytes": 4 * MiB,
        "count": None,
    }
    assert gpu["top_at_peak"][1]["op"] == "extra/Fill" and [s["end_bytes"] for s in gpu["steps"]] == [4 * MiB] * 3
    assert document["samplers"][0]["min_available_bytes"] == 0.3e9
    assert [f["rule"] for f in result.findings if f["rule"] == "host_memory_pressure"] == ["host_memory_pressure"]
    json.dumps(result.to_json())  # plain JSON
    assert main(["analyze", str(run)]) == 0
    text = capsys.readouterr().out
    assert "GPU_0_bfc: peak 11.0 MiB of 16.0 MiB (69 %) at step 1 (24.0 ms into the window)" in text
    assert "headroom: a batch of about 15 fits the allocator's capacity (today 8)" in text
    assert "live at the peak: 4.0 MiB allocated before the traced window; 3.0 MiB extra/Fill [786432] float" in text
    timeline = pd.read_csv(run / "analysis" / "memory.csv")
    assert len(timeline) == 32 and timeline["bytes_in_use"].max() == 11 * MiB + 512
    peak_row = timeline.loc[timeline["bytes_in_use"].idxmax()]
    assert peak_row["step"] == 1 and peak_row["op"] == "gradient_tape/conv/Conv2DBackpropInput"
    page = (run / "analysis" / "report.html").read_text()
    assert 'id="memory"' in page and 'aria-label="GPU_0_bfc: bytes in use over the traced window"' in page
    assert "peak 11 MiB</text>" in page and page.count("<title>step 1: peak 11.0 MiB, 4.0 MiB held at its end") == 1
    assert "<script" not in page


def test_a_trace_without_allocator_events_and_no_samplers_has_no_memory(tmp_path):
    from analysis import analyze
    from trace_fixtures import write_grouped_host_trace

    result = analyze(write_grouped_host_trace(tmp_path / "t.xplane.pb"))
    assert result.memory is None and result.to_json()["memory"] is None and "memory (" not in result.render("text")


# ---------------------------------------------------------------- injected truth (TensorFlow)

HELD_BYTES = 64 * MiB
BATCHES = (16, 64)


def _traced_steps(logdir, hold: bool):
    """Four steps of a tf.function (two 512x512 matmuls) under the profiler, with step markers; with
    `hold`, the step first fills a 64 MiB tensor that it reads only at its end: held across the step."""
    import tensorflow as tf

    def matmuls(x):
        y = tf.matmul(x, x)
        return tf.reduce_sum(tf.matmul(y, y))

    @tf.function
    def held_step(x):
        held = tf.fill([HELD_BYTES // 4], x[0, 0])
        with tf.control_dependencies([held]):
            out = matmuls(x)
        return out + tf.reduce_max(held)

    step = held_step if hold else tf.function(matmuls)
    x = tf.random.stateless_uniform((512, 512), seed=(1, 2))
    step(x)  # traced before the window
    tf.profiler.experimental.start(str(logdir))
    for k in range(4):
        with tf.profiler.experimental.Trace("train", step_num=k, _r=1):
            step(x).numpy()
    tf.profiler.experimental.stop()


def _conv_steps(logdir, batch: int):
    """Three training steps of a small conv model at `batch` under the profiler, with step markers."""
    import keras
    import tensorflow as tf

    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    optimizer, loss_fn = keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    x, y = tf.random.stateless_uniform((batch, 32, 32, 3), seed=(1, 2)), tf.zeros((batch,), tf.int32)
    step(x, y)
    tf.profiler.experimental.start(str(logdir))
    for k in range(3):
        with tf.profiler.experimental.Trace("train", step_num=k, _r=1):
            step(x, y).numpy()
    tf.profiler.experimental.stop()


def make_injected_traces(root: str) -> None:
    """Every trace of the injected-truth test, in one fresh process: the allocator's chunks depend on
    what it served before (a chunk under twice the request is not split), so the batches come first."""
    from pathlib import Path

    root_path = Path(root)
    for batch in BATCHES:
        _conv_steps(root_path / f"b{batch}", batch)
    _traced_steps(root_path / "plain", hold=False)
    _traced_steps(root_path / "held", hold=True)


def _peak_of(logdir, batch: float = math.nan):
    from analysis import analyze
    from analysis.breakdown.memory_allocators import allocator_report

    result = analyze(logdir)
    view = TraceView(read_trace(logdir))
    return allocator_report(view.memory, result.steps[["step", "start_ns", "end_ns"]], view.window[0], batch)[0][0]


@pytest.mark.slow
def test_injected_memory_moves_the_peak_by_its_size_and_the_batch_part_by_the_batch(tmp_path):
    """A tensor held across the step moves the peak by its size and is named; one model at two batches
    moves the batch part by their ratio, and the smaller one's headroom predicts the larger one's peak."""
    import os
    import subprocess
    import sys

    from analysis import analyze
    from repo_paths import REPO

    here = Path(__file__).resolve().parent  # test_memory's own folder: the child imports it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(REPO / "tests" / "support"), str(REPO)])}
    subprocess.run(
        [sys.executable, "-c", f"import test_memory; test_memory.make_injected_traces({str(tmp_path)!r})"],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    before, after = _peak_of(tmp_path / "plain"), _peak_of(tmp_path / "held")
    assert after.name == before.name
    # The held tensor moves the peak by its size; the step's own few MiB may peak at another moment beside
    # it (one run: 63 MiB, the 1 MiB MatMul_1 output freed just before), never by more than they hold.
    assert abs(after.peak_bytes - before.peak_bytes - HELD_BYTES) <= before.peak_bytes
    assert after.by_op[0] == ("Fill", HELD_BYTES)
    live = after.top_at_peak[0]
    assert (live.op, live.shape, live.dtype, live.bytes) == ("Fill", f"[{HELD_BYTES // 4}]", "float", HELD_BYTES)
    # no batch size is known (no run.json): a fixed tensor and a batch-sized one are not told apart
    assert after.holder is not None and (after.holder.op, after.holder.kind) == ("Fill", "tensor")
    holder = [f for f in analyze(tmp_path / "held").findings if f["rule"] == "memory_one_holder"]
    # the host allocator's capacity is the machine's memory: a holder under 1 % of it raises nothing
    if HELD_BYTES >= 0.01 * after.capacity_bytes:
        assert holder and holder[0]["evidence"].startswith("Fill holds 64.0 MiB")
    else:
        assert not holder
    small, large = (_peak_of(tmp_path / f"b{batch}", float(batch)) for batch in BATCHES)
    ratio = BATCHES[1] / BATCHES[0]
    assert small.batch_bytes > 0 and large.batch_bytes == pytest.approx(ratio * small.batch_bytes, rel=0.02)
    assert small.fixed_bytes + small.batch_bytes * ratio == pytest.approx(large.peak_bytes, rel=0.10)


@pytest.mark.slow
def test_the_memory_chart_opens_in_chromium_without_errors_and_is_drawn(tmp_path):
    import io

    from PIL import Image

    import browser
    from analysis import analyze

    run, _ = _run_dir(tmp_path)
    report = analyze(run).to_html(tmp_path / "report.html")
    loaded = browser.load(report, boxes=("#memory svg", "#memory table"))
    assert loaded.errors == [] and loaded.requests == []
    chart, table = loaded.boxes["#memory svg"], loaded.boxes["#memory table"]
    assert chart is not None and table is not None and chart["height"] > 150
    assert table["x"] > chart["x"] + chart["width"] - 1  # the table of what was live beside the chart
    image = Image.open(io.BytesIO(loaded.screenshot)).convert("RGB")
    scale = image.width / 1280
    left, top, right, bottom = (
        int(v * scale) for v in (chart["x"], chart["y"], chart["x"] + chart["width"], chart["y"] + chart["height"])
    )
    crop = image.crop((left, top, right, bottom))
    pixels = np.asarray(crop, dtype=int)
    red = (pixels[..., 0] > 180) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)  # the peak's mark
    blue = (pixels[..., 2] > 150) & (pixels[..., 0] < 80)  # bytes in use
    assert red.sum() > 20 and blue.sum() > 200


def test_allocator_events_keep_their_stats_where_the_trace_drops_events_with_impossible_times(tmp_path):
    import warnings

    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    host = _Plane(space, 0, "/host:CPU")
    line = host.line(1, "tf_Compute/1", 10**9)
    for k in range(20):
        host.event(line, "ExecutorState::Process", 10**9 + 100 * k, 10**9 + 100 * k + 50)
    host.event(
        line,
        "MemoryAllocation",
        10**9 + 3000,
        10**9 + 3000,
        allocator_name="cpu",
        bytes_allocated=512,
        allocation_bytes=512,
        tf_op="Cast",
    )
    host.finish()
    # an event with a negative duration before the allocation: dropped, and the rows after it renumbered
    line.events.insert(0, line.events[0].__class__(metadata_id=1, offset_ps=0, duration_ps=-5000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        view = TraceView(read_trace(_write_space(space, tmp_path / "t.xplane.pb")))
    memory = view.memory
    assert len(memory) == 1 and memory["op"].iat[0] == "Cast" and memory["bytes_in_use"].iat[0] == 512
