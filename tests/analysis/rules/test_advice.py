"""Advice users can act on: the verdict names the part whose fix saves the most, every estimate has
its basis, precision is advised from measured ceilings only, and no advice names a flag or API the
program does not use (producer x cause)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest

from analysis import comparison as compare
from analysis import pipeline
from analysis.breakdown.eager import EagerOps
from analysis.breakdown.idle import IdleStretch
from analysis.breakdown.input_stages import SlowestStage
from analysis.breakdown.roofline import BelowRoofline
from analysis.rules import finding_rules
from analysis.rules import table as rules
from analysis.rules.facts import TraceFacts, make_facts
from compare_fixtures import make_run as make_compare_run
from run_fixtures import edit_run_json

TRACE_FACTS = {f.name for f in dataclasses.fields(TraceFacts)}


def verdict_of(step_ms: float, **parts) -> tuple[dict, list[dict]]:
    """The verdict and findings of a mean step given as ms per part (input_wait, input_copy, compute,
    host, collective) and further facts."""
    wait, copy = parts.pop("input_wait", 0.0), parts.pop("input_copy", 0.0)
    compute, host, collective = parts.pop("compute"), parts.pop("host"), parts.pop("collective", 0.0)
    assert abs(wait + copy + compute + host + collective - step_ms) < 1e-9
    pct = lambda ms: 100.0 * ms / step_ms  # noqa: E731
    mean = {
        "step_ms": step_ms,
        "input_ms": wait + copy,
        "compute_ms": compute,
        "host_ms": host,
        "collective_ms": collective,
        "input_wait_ms": wait,
        "input_copy_ms": copy,
        "input_pct": pct(wait + copy),
        "compute_pct": pct(compute),
        "host_pct": pct(host),
        "collective_pct": pct(collective),
    }
    trace = TraceFacts(**{key: parts.pop(key) for key in list(parts) if key in TRACE_FACTS})
    facts = make_facts(
        trace=trace,
        input_pct=pct(wait + copy),
        compute_pct=pct(compute),
        host_pct=pct(host),
        collective_pct=pct(collective),
        input_wait_pct=pct(wait),
        input_copy_pct=pct(copy),
        input_wait_ms=wait,
        step_ms=step_ms,
        **{"device": "gpu", "producer": "devprof", **parts},
    )
    return rules.make_verdict(mean, facts, steps_used=10), finding_rules.findings(facts)


# A part with a small fix still holds the step; a smaller fix of another part is listed beside it.
def test_host_overhead_holds_the_step_and_the_exposed_copy_is_still_a_fix():
    verdict, _ = verdict_of(20.0, input_wait=0.5, input_copy=1.4, compute=7.1, host=11.0)
    assert verdict["bound"] == "host" and verdict["level"] == "high" and verdict["bound_pct"] == pytest.approx(55.0)
    assert verdict["saving_ms"] > 1.9  # more than removing all of the input could save
    fixes = {fix["rule"]: fix for fix in verdict["fixes"]}
    assert (
        fixes["input_copy"]["saving_ms"] == pytest.approx(1.4) and "prefetch_to_device" in fixes["input_copy"]["advice"]
    )
    assert [fix["saving_pct"] for fix in verdict["fixes"]] == sorted(
        (f["saving_pct"] for f in verdict["fixes"]), reverse=True
    )
    assert all(fix["saving_pct"] >= 5.0 for fix in verdict["fixes"]) and verdict["first_fix"] == verdict["fixes"][0]
    assert verdict["xprof_reading"] is None  # nothing said in XProf's name from devprof's own input


def test_a_short_step_mostly_device_work_is_compute_bound_whatever_its_fixes_save():
    verdict, _ = verdict_of(9.0, input_wait=0.63, compute=5.67, host=2.7, prefetches=True)
    assert verdict["bound"] == "compute", verdict
    assert verdict["first_fix"]["rule"] == "host_bound"
    assert "Compute-bound: the device's kernels take 63 % of the step" in verdict["evidence"]
    assert "The largest fix we can estimate is running several steps per call" in verdict["evidence"]


def test_a_step_held_by_its_kernels_is_compute_bound_when_hiding_input_saves_the_most():
    verdict, _ = verdict_of(30.0, input_wait=12.0, compute=16.0, host=2.0, prefetches=False)
    assert verdict["bound"] == "compute" and verdict["rule"] == "compute_bound" and verdict["level"] == "high"
    # Prefetch hides the 12 ms under the 18 ms rest of the step: all of it; the largest fix, named beside the bound.
    assert verdict["first_fix"]["rule"] == "input_wait" and verdict["saving_ms"] == pytest.approx(12.0)
    assert "prefetching overlaps the pipeline's 12.00 ms per batch" in verdict["saving_basis"]
    assert "hiding the wait for the input pipeline: 12.00 ms, 40 % of the step" in verdict["evidence"]
    held, _ = verdict_of(30.0, input_wait=16.0, compute=12.0, host=2.0, prefetches=False)
    assert (
        held["bound"] == "input"
        and held["rule"] == "input_bound_high"
        and held["bound_pct"] == pytest.approx(53.3, abs=0.1)
    )


def test_prefetch_saves_only_down_to_the_pipelines_rate():
    # 25 ms of pipeline per batch against 5 ms of everything else: prefetch leaves a 25 ms step.
    verdict, _ = verdict_of(30.0, input_wait=25.0, compute=4.0, host=1.0, prefetches=False)
    assert verdict["saving_ms"] == pytest.approx(5.0)


def test_on_a_cpu_the_pipeline_takes_cores_from_compute():
    gpu, _ = verdict_of(30.0, input_wait=10.0, compute=18.0, host=2.0, prefetches=False)
    cpu, _ = verdict_of(30.0, input_wait=10.0, compute=18.0, host=2.0, prefetches=False, device="cpu", cpu_cores=2)
    assert gpu["saving_ms"] == pytest.approx(10.0) and cpu["saving_ms"] == pytest.approx(5.0)


def test_an_exposed_copy_is_advised_as_a_copy_not_as_tf_data():
    # The kernels take 80 % of the step and the batch copy 12 %: compute-bound, and hiding the copy is the fix.
    verdict, _ = verdict_of(25.0, input_wait=0.1, input_copy=3.0, compute=20.0, host=1.9, prefetches=True)
    assert verdict["bound"] == "compute" and verdict["first_fix"]["rule"] == "input_copy"
    assert "hiding the batch copy" in verdict["evidence"] and "kernels take 80 %" in verdict["evidence"]
    assert verdict["saving_ms"] == pytest.approx(3.0, abs=0.2)
    assert "prefetch_to_device" in verdict["advice"][0]
    input_held, _ = verdict_of(25.0, input_wait=0.1, input_copy=13.0, compute=10.0, host=1.9, prefetches=True)
    assert input_held["bound"] == "input" and "copy to the device" in input_held["evidence"]


def test_a_whole_eager_step_is_eager_bound_and_compiling_it_comes_first():
    eager = EagerOps(op_time_pct=100.0, ms_per_step=30.0, step_pct=60.0, ops=(("MatMul", 30.0),))
    verdict, found = verdict_of(50.0, compute=15.0, host=35.0, eager=eager, producer="keras")
    assert (
        verdict["bound"] == "eager" and verdict["rule"] == "eager_bound" and verdict["bound_pct"] == pytest.approx(70.0)
    )
    assert "run_eagerly=False" in verdict["advice"][0]  # Keras' run_eagerly first, not steps_per_execution
    assert not any("steps_per_execution" in line for line in verdict["advice"])
    assert found[0]["rule"] == "eager_execution" and found[0]["saving_ms"] == pytest.approx(35.0)


def test_compiling_an_eager_cpu_step_keeps_its_ops_less_the_eager_floor_run_side_by_side():
    # 100 ms: 60 of eager ops (300 calls, each paying at least 0.02 ms of eager runtime), the rest Python between
    # them and dispatch. Compiled on 2 cores: (60 - 300 x 0.02) x (1 + 1/2) / 2 = 40.5 ms, less the 1 ms launch floor.
    eager = EagerOps(
        op_time_pct=100.0,
        ms_per_step=60.0,
        step_pct=60.0,
        ops=(("MatMul", 30.0),),
        calls_per_step=300.0,
        call_floor_ms=0.02,
    )
    verdict, found = verdict_of(100.0, compute=90.0, host=10.0, eager=eager, device="cpu", cpu_cores=2, launch_ms=1.0)
    saving = next(f for f in found if f["rule"] == "eager_execution")["saving_ms"]
    assert saving == pytest.approx(100.0 - 40.5 - 1.0)
    assert verdict["saving_ms"] == pytest.approx(saving)
    one_core, _ = verdict_of(100.0, compute=90.0, host=10.0, eager=eager, device="cpu", cpu_cores=1, launch_ms=1.0)
    assert one_core["saving_ms"] == pytest.approx(100.0 - 54.0 - 1.0)  # nothing runs side by side on one core


def test_findings_are_ordered_by_saving_and_the_verdict_saves_at_least_as_much():
    _, found = verdict_of(
        40.0,
        input_wait=4.0,
        compute=26.0,
        host=10.0,
        prefetches=False,
        retrace_steps=2,
        retrace_ms=8.0,
        traced_steps=20,
        other_cpu_pct=40.0,
        proc_cpu_pct=100.0,
        cpu_cores=4.0,
        idle_stretch=IdleStretch(0.0, 5.0, 5.0, "after the last epoch", "proc_cpu_pct"),
    )
    verdict, _ = verdict_of(
        40.0,
        input_wait=4.0,
        compute=26.0,
        host=10.0,
        prefetches=False,
        retrace_steps=2,
        retrace_ms=8.0,
        traced_steps=20,
        other_cpu_pct=40.0,
        proc_cpu_pct=100.0,
        cpu_cores=4.0,
    )
    known = [f["saving_ms"] for f in found if f["saving_ms"] is not None]
    assert known == sorted(known, reverse=True) and found[-1]["rule"] == "idle_stretch"
    assert found[-1]["saving_ms"] is None
    assert verdict["saving_ms"] >= max(known)


MEASURED_AMD = (("bfloat16", 185e9), ("float32", 325e9))  # devprof peak on an AVX512-BF16 CPU without AMX


def test_a_float32_run_is_not_told_to_use_bfloat16_where_it_measures_slower():
    verdict, found = verdict_of(
        100.0,
        input_wait=1.0,
        compute=97.0,
        host=2.0,
        device="cpu",
        bfloat16_units=("avx512_bf16",),
        matrix_ceilings=MEASURED_AMD,
        matrix_pct=80.0,
    )
    text = " ".join(verdict["advice"]) + " ".join(f["advice"] for f in found)
    assert "Use mixed precision" not in text and "--precision mixed_bfloat16" not in text
    assert "Keep float32: bfloat16 185 GFLOP/s against float32 325 GFLOP/s" in text


def test_a_bfloat16_run_that_measures_slower_is_told_to_go_back():
    verdict, found = verdict_of(
        100.0,
        input_wait=1.0,
        compute=97.0,
        host=2.0,
        device="cpu",
        precision="mixed_bfloat16",
        bfloat16_units=("avx512_bf16",),
        matrix_ceilings=MEASURED_AMD,
        matrix_pct=80.0,
    )
    assert verdict["cause"] == "bf16_without_matrix_units" and "--precision float32" in verdict["advice"][0]
    assert not any("larger" in line for line in verdict["advice"][:1])
    # 80 ms of matrix work at 325/185 of the rate: 80 x (1 - 185/325) = 34.5 ms
    assert verdict["saving_ms"] == pytest.approx(80.0 * (1 - 185 / 325), abs=1e-3)
    assert found[0]["rule"] == "bf16_without_matrix_units"


def test_without_a_measurement_precision_advice_says_it_is_a_guess():
    verdict, _ = verdict_of(
        100.0, input_wait=1.0, compute=97.0, host=2.0, device="cpu", bfloat16_units=("avx512_bf16",)
    )
    assert any("guess" in line and "devprof peak" in line for line in verdict["advice"])
    assert not any(line.startswith("Use mixed precision") for line in verdict["advice"])


def test_measured_faster_precision_is_advised_with_its_saving():
    verdict, _ = verdict_of(
        100.0,
        input_wait=1.0,
        compute=97.0,
        host=2.0,
        device="gpu",
        matrix_ceilings=(("float16", 120e12), ("float32", 15e12)),
        matrix_pct=70.0,
    )
    assert verdict["bound"] == "compute" and verdict["saving_ms"] == pytest.approx(70.0 * (1 - 15 / 120))
    assert verdict["advice"][0].startswith("Use mixed precision: `--precision mixed_float16`")


# Producer x cause: every advice line in the producer's terms.
FOREIGN = {
    "devprof": r"model\.compile|jax|lax\.|tf\.range|steps inside one",
    "keras": r"(?<![\w-])--[a-z]|jax|lax\.|tf\.range",
    "tensorflow": r"(?<![\w-])--[a-z]|model\.compile|`fit`|jax|lax\.",
    "jax": r"(?<![\w-])--[a-z]|model\.compile|tf\.|keras|tf\.function|TF_ENABLE",
}
CAUSES: dict[str, dict[str, Any]] = {
    "input_wait": dict(
        input_wait=8.0,
        compute=10.0,
        host=2.0,
        prefetches=False,
        slowest_input_stage=SlowestStage("Iterator::Root::Map", 7.5),
    ),
    "input_copy": dict(input_copy=6.0, compute=12.0, host=2.0),
    "host": dict(
        compute=8.0, host=12.0, sync_name="MemcpyDtoH", kernels_per_step=900.0, mean_kernel_us=5.0, idle_host_pct=50.0
    ),
    "collective": dict(compute=10.0, host=2.0, collective=8.0),
    "compute": dict(
        compute=19.0,
        host=1.0,
        matrix_units=("float16",),
        retrace_steps=1,
        retrace_ms=3.0,
        below_roofline=(BelowRoofline("conv", "Conv2D", "matrix", "float32", "compute", "", 10.0, 8.0, 40.0, 1e12),),
    ),
    "eager_all": dict(compute=5.0, host=15.0, eager=EagerOps(100.0, 10.0, 50.0, (("MatMul", 10.0),))),
    "eager_some": dict(compute=10.0, host=10.0, eager=EagerOps(30.0, 4.0, 20.0, (("Mean", 4.0),))),
    "contention": dict(compute=15.0, host=5.0, other_cpu_pct=45.0, proc_cpu_pct=100.0, cpu_cores=4.0),
}


@pytest.mark.parametrize("producer", sorted(FOREIGN))
@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_no_advice_names_a_flag_or_api_the_program_does_not_use(producer, cause):
    parts = dict(CAUSES[cause])
    if producer == "jax":  # no tf.data in the trace
        parts.pop("slowest_input_stage", None)
        parts.pop("prefetches", None)
    verdict, found = verdict_of(20.0, producer=producer, **parts)
    lines = verdict["advice"] + [f["advice"] for f in found]
    assert lines
    for line in lines:
        assert not re.search(FOREIGN[producer], line), (producer, cause, line)


def test_the_first_advice_fits_the_verdicts_cause_in_each_program():
    parts = CAUSES["host"]
    assert "--steps-per-execution" in verdict_of(20.0, producer="devprof", **parts)[0]["advice"][0]
    assert "model.compile(..., steps_per_execution=" in verdict_of(20.0, producer="keras", **parts)[0]["advice"][0]
    assert "tf.range(" in verdict_of(20.0, producer="tensorflow", **parts)[0]["advice"][0]
    assert "jax.lax.scan" in verdict_of(20.0, producer="jax", **parts)[0]["advice"][0]


def test_compare_rows_classify_by_share_too():
    host_heavy = make_facts(input_pct=9.5, host_pct=55.0, compute_pct=35.5)
    assert rules.classify(host_heavy) == ("host", "high")
    computing = dataclasses.replace(host_heavy, host_pct=1.0, compute_pct=89.5)
    assert rules.classify(computing) == ("compute", "high")  # by share: a 9.5 % input does not take the bound


def test_the_verdicts_saving_is_never_below_a_findings_on_random_steps():
    import random

    rng = random.Random(35)
    for _ in range(300):
        parts = [rng.uniform(0.0, 1.0) for _ in range(5)]
        scale = rng.uniform(1.0, 200.0) / sum(parts)
        wait, copy, compute, host, collective = (p * scale for p in parts)
        step = wait + copy + compute + host + collective
        extra = dict(
            prefetches=rng.choice([None, True, False]),
            cpu_cores=rng.choice([math.nan, 2.0, 16.0]),
            device=rng.choice(["cpu", "gpu"]),
            other_cpu_pct=rng.uniform(0, 60),
            proc_cpu_pct=rng.uniform(10, 200),
            idle_host_pct=rng.uniform(0, 60),
            kernels_per_step=rng.uniform(10, 2000),
            mean_kernel_us=rng.uniform(1, 100),
            retrace_steps=rng.choice([0, 2]),
            retrace_ms=rng.uniform(0, 50),
            traced_steps=10,
            eager=rng.choice([None, EagerOps(rng.uniform(0, 100), 1.0, rng.uniform(0, 60), ())]),
            matrix_ceilings=rng.choice(
                [(), (("bfloat16", 1e11), ("float32", 3e11)), (("bfloat16", 4e11), ("float32", 1e11))]
            ),
            matrix_pct=rng.uniform(0, 100) * compute / step,
            precision=rng.choice(["float32", "mixed_bfloat16"]),
        )
        verdict, found = verdict_of(
            step, input_wait=wait, input_copy=copy, compute=compute, host=host, collective=collective, **extra
        )
        known = [f["saving_ms"] for f in found if f["saving_ms"] is not None]
        if known and verdict["fixes"]:  # savings within the tie tolerance rank by the fixed order
            tie_ms = max(rules.TIE_SHARE * max(known), rules.TIE_MS)
            assert verdict["saving_ms"] >= max(known) - tie_ms - 1e-3, (verdict, found)
        # The bound is the largest part, whatever the fixes save; the fixes are every one >= 5 %, largest first.
        shares = {"input": wait + copy, "compute": compute, "host": host, "collective": collective}
        if verdict["bound"] != "eager":
            assert shares[verdict["bound"]] >= max(shares.values()) - 1e-9, (verdict["bound"], shares)
        savings = [fix["saving_pct"] for fix in verdict["fixes"]]
        assert all(pct >= 5.0 for pct in savings)
        for i, earlier in enumerate(savings):  # largest first, but for ties
            for later in savings[i + 1 :]:
                assert later <= earlier + max(rules.TIE_SHARE * later, 100.0 * rules.TIE_MS / step) + 1e-9, savings
        listed = {fix["rule"]: fix["saving_pct"] for fix in verdict["fixes"]}
        assert all(
            f["saving_pct"] < 5.0 or f["rule"] in listed or f["saving_pct"] in listed.values()
            for f in found
            if f["saving_pct"] is not None
        ), verdict  # said by its part's own fix
        for item in (verdict, *found):
            if item["saving_ms"] is not None:
                assert -1e-9 <= item["saving_ms"] <= step + 1e-6, item  # a fix saves at most the whole step


@pytest.mark.parametrize("ceilings", [(), MEASURED_AMD])
def test_no_float32_cpu_run_is_told_to_use_bfloat16_from_its_flags(ceilings):
    slow_conv = BelowRoofline(
        "conv", "_MklConv2D", "matrix", "float32", "compute", "oneDNN brg_conv_fwd:avx512_core", 20.0, 50.0, 60.0, 1e11
    )
    verdict, found = verdict_of(
        100.0,
        input_wait=1.0,
        compute=90.0,
        host=9.0,
        device="cpu",
        precision="float32",
        bfloat16_units=("avx512_bf16",),
        matrix_units=("bfloat16",),
        matrix_ceilings=ceilings,
        matrix_pct=80.0,
        below_roofline=(slow_conv,),
    )
    for line in verdict["advice"] + [f["advice"] for f in found]:
        told = re.search(r"mixed_bfloat16", line) and not re.search(r"guess|Keep float32|would be slower", line)
        assert not told, line


def test_a_pipeline_that_waits_takes_no_cores_from_compute_and_one_that_computes_does():
    # 2 cores, compute on both for 18 of 30 ms, 10 ms of pipeline per batch, 2 ms of host.
    common = dict(input_wait=10.0, compute=18.0, host=2.0, prefetches=False, device="cpu", cpu_cores=2.0)
    # The process used 2 x 60 % + 6.7 % (host): nothing left for the pipeline, which sleeps or reads.
    sleeps, _ = verdict_of(30.0, proc_cpu_pct=126.6, **common)
    # ... and with 10 ms of one core more: the pipeline computes, and overlapping it costs compute 5 ms.
    computes, _ = verdict_of(30.0, proc_cpu_pct=160.0, **common)
    assert sleeps["saving_ms"] == pytest.approx(10.0)
    assert computes["saving_ms"] == pytest.approx(5.0)
    assert "takes no CPU time from compute" in sleeps["saving_basis"]
    # Compute's threads wait on each other: its ops' own time is 27 ms, not 2 x 18 = 36. The same 126.6 % of
    # process CPU (38 core-ms) then leaves 38 - 27 - 2 = 9 ms for the pipeline, which costs compute 4.5 ms.
    waiting_threads, _ = verdict_of(30.0, proc_cpu_pct=126.6, op_ms=27.0, **common)
    assert waiting_threads["saving_ms"] == pytest.approx(30.0 - (20.0 + (37.98 - 27.0 - 2.0) / 2), abs=0.01)


def test_the_input_fix_counts_the_stage_it_takes_out_or_spreads_over_the_cores():
    python_stage = SlowestStage("Iterator::Root::Map", 30.0, runs_python=True)
    serial_stage = SlowestStage("Iterator::Root::Map", 30.0)
    common = dict(input_wait=31.0, compute=5.0, host=1.0, prefetches=False)
    # Prefetch alone leaves a 31 ms pipeline: saves the 6 ms rest; taking the Python out leaves 1 ms.
    assert verdict_of(37.0, **common)[0]["saving_ms"] == pytest.approx(6.0)
    out, _ = verdict_of(37.0, slowest_input_stage=python_stage, **common)
    assert out["saving_ms"] == pytest.approx(31.0) and out["level"] == "high"
    # A serial map on 4 cores: 1 + 30 / 4 = 8.5 ms per batch against 6 ms of the rest.
    spread, _ = verdict_of(37.0, slowest_input_stage=serial_stage, cpu_cores=4.0, device="gpu", **common)
    assert spread["saving_ms"] == pytest.approx(37.0 - 8.5)


def test_spreading_a_cpu_pipeline_over_the_cores_saves_no_more_than_the_busy_cores_allow():
    # A prefetched serial map of 33 ms a batch holds a 34 ms step (20 ms the rest). On 4 idle cores, spreading
    # it leaves 33 / 4 = 8.25 ms a batch: the step becomes the rest, 20 ms. But where the process already keeps
    # 1.45 of 2 cores busy, its work needs 1.45 / 2 of the step however it is spread (whatever others take).
    stage = SlowestStage("Iterator::Root::Map", 13.0, ms_per_batch=33.0)
    common = dict(input_wait=13.0, compute=20.0, host=1.0, prefetches=True, slowest_input_stage=stage, device="cpu")
    idle, _ = verdict_of(34.0, cpu_cores=4.0, proc_cpu_pct=145.0, other_cpu_pct=0.0, **common)
    busy, _ = verdict_of(34.0, cpu_cores=2.0, proc_cpu_pct=145.0, other_cpu_pct=6.0, **common)
    assert idle["saving_ms"] == pytest.approx(13.0)
    assert busy["saving_ms"] == pytest.approx(34.0 - 34.0 * 1.45 / 2.0)
    assert "does not shrink it" in busy["saving_basis"]


def test_several_steps_per_call_also_save_the_calls_own_dispatch_counted_as_compute():
    # On a CPU the call's set-up before its first op and tear-down after its last are compute (as XProf counts
    # them), yet a call of k steps pays them once: 2 ms of it adds 2 x (1 - 1/k) to the host part's saving.
    common = dict(compute=20.0, host=10.0, device="cpu", cpu_cores=2)
    without, _ = verdict_of(30.0, **common)
    with_entry, _ = verdict_of(30.0, call_entry_exit_ms=2.0, **common)
    per_call = re.search(r"(\d+) steps per call", without["saving_basis"])
    assert per_call is not None
    k = int(per_call.group(1))
    assert with_entry["saving_ms"] - without["saving_ms"] == pytest.approx(2.0 * (1 - 1 / k))
    assert "dispatch around its ops" in with_entry["saving_basis"]


def _fix(rule: str, pct: float):
    from analysis.rules import savings as saving_mod

    return rules.Fix(rule, "x", saving_mod.Saving(pct, "given"))


@pytest.mark.parametrize("precision_pct, rewrite_pct", [(21.0, 20.7), (20.7, 21.0), (20.0, 20.0)])
def test_fixes_within_noise_of_each_other_rank_by_the_fixed_order(precision_pct, rewrite_pct):
    # Two identical runs: a prefetch against a change of precision, their savings within 10 %: the same first fix.
    ranked = rules.ranked_fixes(
        [_fix("compute_bound", precision_pct), _fix("no_prefetch", rewrite_pct), _fix("host_bound", 5.0)], step_ms=100.0
    )
    assert [fix.rule for fix in ranked] == ["no_prefetch", "compute_bound", "host_bound"]


def test_fixes_beyond_noise_rank_by_saving_and_one_ms_ties_on_a_short_step():
    apart = rules.ranked_fixes([_fix("compute_bound", 30.0), _fix("no_prefetch", 20.0)], step_ms=100.0)
    assert [fix.rule for fix in apart] == ["compute_bound", "no_prefetch"]  # 10 points apart: no tie
    # a 4 ms step: 30 % and 8 % of it are 1.2 and 0.32 ms, within 1 ms: a tie; on a 400 ms step they are apart
    short = rules.ranked_fixes([_fix("compute_bound", 30.0), _fix("host_bound", 8.0)], step_ms=4.0)
    assert [fix.rule for fix in short] == ["host_bound", "compute_bound"]
    long_ = rules.ranked_fixes([_fix("compute_bound", 30.0), _fix("host_bound", 8.0)], step_ms=400.0)
    assert [fix.rule for fix in long_] == ["compute_bound", "host_bound"]


@pytest.mark.parametrize(
    "dtype, kernel", [("bfloat16", "oneDNN jit:avx512_core_amx"), ("float32", "oneDNN jit:avx512_core")]
)
def test_below_roofline_on_an_amx_cpu_says_nothing_the_machine_contradicts(dtype, kernel):
    slow_conv = BelowRoofline("conv", "_MklConv2D", "matrix", dtype, "compute", kernel, 20.0, 50.0, 60.0, 1e11)
    _, found = verdict_of(
        100.0,
        input_wait=1.0,
        compute=90.0,
        host=9.0,
        device="cpu",
        producer="tensorflow",
        precision="mixed_bfloat16" if dtype == "bfloat16" else "float32",
        bfloat16_units=("avx512_bf16", "amx_bf16"),
        matrix_units=("bfloat16",),
        matrix_pct=80.0,
        below_roofline=(slow_conv,),
    )
    advice = next(f["advice"] for f in found if f["rule"] == "below_roofline")
    assert "this CPU has none" not in advice and "a CPU with AVX-512 or AMX" not in advice, advice
    assert "not one of the brgemm kernels (brg_conv_*, brg:*) this CPU has" in advice
    assert "devprof run" not in advice  # the user's own program
    if dtype == "bfloat16":
        assert "bfloat16 (" not in advice  # the dtype it already runs in


def test_a_float64_model_is_named_and_not_told_to_turn_onednn_on():
    from analysis.rules.facts import run_precision

    assert run_precision({}, "float64") == "float64" and run_precision({"precision": "float32"}, "float64") == "float64"
    assert (
        run_precision({}, "bfloat16") == "mixed_bfloat16"
        and run_precision({"precision": "float32"}, "bfloat16") == "float32"
    )
    verdict, found = verdict_of(
        40.0,
        input_wait=1.0,
        compute=37.0,
        host=2.0,
        device="cpu",
        producer="keras",
        precision=run_precision({}, "float64"),
        eigen_dense_pct=70.0,
        matrix_pct=80.0,
    )
    rules_found = {f["rule"]: f for f in found}
    assert "cpu_without_onednn" not in rules_found  # Eigen ran because the ops are float64, not for want of oneDNN
    float64 = rules_found["float64_math"]
    assert 'set_floatx("float32")' in float64["advice"] and float64["saving_ms"] == pytest.approx(0.5 * 0.8 * 40.0)
    assert verdict["first_fix"]["rule"] == "float64_math"
    # the same run in float32: oneDNN's absence is the finding
    _, float32_found = verdict_of(
        40.0,
        input_wait=1.0,
        compute=37.0,
        host=2.0,
        device="cpu",
        producer="keras",
        precision="float32",
        eigen_dense_pct=70.0,
        matrix_pct=80.0,
    )
    assert "cpu_without_onednn" in {f["rule"] for f in float32_found}


def test_a_run_in_bfloat16_by_its_trace_is_not_told_to_use_bfloat16():
    from analysis.rules.facts import run_precision

    verdict, found = verdict_of(
        100.0,
        input_wait=1.0,
        compute=90.0,
        host=9.0,
        device="cpu",
        producer="keras",
        precision=run_precision({}, "bfloat16"),
        bfloat16_units=("amx_bf16",),
        matrix_units=("bfloat16",),
        matrix_ceilings=(("bfloat16", 4e12), ("float32", 4.6e11)),
        matrix_pct=80.0,
    )
    for line in verdict["advice"] + [f["advice"] for f in found]:
        assert 'set_global_policy("mixed_bfloat16")' not in line, line
    assert "fp32_on_matrix_units" not in {f["rule"] for f in found}


AMX_CEILINGS = (("bfloat16", 4.01e12), ("float32", 4.6e11))  # 8.7x at the sizes devprof peak reached its peak
AMX_SMALL = (
    ("conv", "float32", 3.0e11),
    ("conv", "bfloat16", 6.0e11),  # 2x on its smallest convolutions
    ("matmul", "float32", 4.0e11),
    ("matmul", "bfloat16", 1.2e12),
)


def test_a_precision_estimate_holds_to_what_small_ops_reach_and_does_not_outrank_a_sleep():
    # A program that sleeps 15 ms in its loop: host 15.7 of 43.4 ms, its convolutions 24.6 ms. At the
    # ceilings' 8.7x, bfloat16 would save 21.8 ms and outrank the sleep; its small convolutions reach 2x.
    common = dict(
        input_wait=0.0,
        compute=27.7,
        host=15.7,
        device="cpu",
        producer="tensorflow",
        precision="float32",
        matrix_units=("bfloat16",),
        bfloat16_units=("amx_bf16",),
        matrix_ceilings=AMX_CEILINGS,
        matrix_pct=100.0 * 24.6 / 43.4,
    )
    verdict, found = verdict_of(43.4, small_matrix_rates=AMX_SMALL, **common)
    precision = next(f for f in found if f["rule"] == "fp32_on_matrix_units")
    assert precision["saving_ms"] == pytest.approx(24.6 * (1 - 1 / 2.0))
    assert "smallest convolutions, 2.00x" in precision["saving_basis"] and "up to 21.78 ms" in precision["saving_basis"]
    assert verdict["first_fix"]["rule"] == "host_bound", verdict["fixes"]
    # without the small sizes, the ceilings' ratio is said to be an upper bound
    _, unbounded = verdict_of(43.4, **common)
    basis = next(f for f in unbounded if f["rule"] == "fp32_on_matrix_units")["saving_basis"]
    assert "8.72x, an upper bound that only large shapes reach" in basis


def test_the_smallest_sizes_devprof_peak_timed_are_read_from_its_result():
    from analysis.breakdown.roofline import smallest_matrix_rates

    peak = {
        "conv": {
            "float32": {"sizes": [{"size": 128, "per_second": 2e11}, {"size": 64, "per_second": 1e11}]},
            "bfloat16": {"sizes": [{"size": 64, "per_second": 3e11}]},
        },
        "matmul": {"float32": {"sizes": []}, "bfloat16": "broken"},
    }
    assert smallest_matrix_rates(peak) == (("conv", "float32", 1e11), ("conv", "bfloat16", 3e11))
    assert smallest_matrix_rates(None) == () and smallest_matrix_rates({"conv": "x"}) == ()


# ---------------------------------------------------------------- bfloat16 on a CPU that emulates it


def test_bfloat16_on_a_cpu_that_emulates_it_is_a_finding_in_analyze_and_compare(tmp_path):
    def device(units):
        return lambda m: m["device"].update(bfloat16_units=units)

    emulated = edit_run_json(make_compare_run(tmp_path, "emulated", precision="mixed_bfloat16"), device([]))
    native = edit_run_json(make_compare_run(tmp_path, "native", precision="mixed_bfloat16"), device(["amx_bf16"]))
    unknown = edit_run_json(make_compare_run(tmp_path, "unknown", precision="mixed_bfloat16"), device(None))
    found = pipeline.analyze(emulated).findings
    assert [f["rule"] for f in found] == ["bf16_without_matrix_units"]
    assert found[0]["severity"] == "warning" and "--precision float32" in found[0]["advice"]
    assert "emulated" in found[0]["evidence"]
    for other in (native, unknown):
        assert "bf16_without_matrix_units" not in [f["rule"] for f in pipeline.analyze(other).findings]
    table = compare.compare_runs([emulated, native])
    rules_found = dict(zip(table["run"], table["findings"]))
    assert [f["rule"] for f in rules_found["emulated"]] == ["bf16_without_matrix_units"]
    assert rules_found["native"] == []
