"""tf.data stage self time: nesting on one thread, and waiting on another pipeline, as traced by tf.distribute."""

import pandas as pd
import pytest

from analysis.breakdown import input_stages as stages_mod
from analysis.breakdown.input_stages import SlowestStage, stage_self_ns
from analysis.rules.table import make_verdict
from views import facts_from_mean, view_of

MS = 1_000_000


def events(rows):
    frame = pd.DataFrame(rows, columns=["name", "plane", "line", "start_ns", "end_ns"])
    frame["duration_ns"] = frame["end_ns"] - frame["start_ns"]
    frame["name"] = frame["name"].astype("category")
    frame["plane_name"] = "/host:CPU"
    return frame


def slowest_input_stage(frame, steps):
    return str(stages_mod.slowest_in_table(stages_mod.input_stage_table(view_of(frame)), steps))


def prefetches(frame):
    return stages_mod.prefetches(view_of(frame))


def distributed_input_trace(steps=4, sleep_ms=30):
    """Per step, as a devprof run with --inject-input-delay-ms records it: on the training thread
    (line 0) tf.distribute's Generator forwards another pipeline; on line 4 that pipeline's Map
    sleeps inside its own function after pulling from a Prefetch; line 6 is the prefetch's producer."""
    rows = []
    for k in range(steps):
        t = k * 100 * MS
        rows += [
            ("Iterator::Root", 0, 0, t, t + (sleep_ms + 6) * MS),
            ("Iterator::Root::Generator", 0, 0, t, t + (sleep_ms + 6) * MS),
            ("InstantiatedCapturedFunction::RunWithBorrowedArgs", 0, 0, t + MS // 10, t + (sleep_ms + 6) * MS),
            ("Iterator::Root", 0, 4, t + 2 * MS, t + (sleep_ms + 3) * MS),
            ("Iterator::Root::Map", 0, 4, t + 2 * MS, t + (sleep_ms + 3) * MS),
            ("Iterator::Root::Map::Prefetch", 0, 4, t + 2 * MS, t + 2 * MS + MS // 5),
            ("InstantiatedCapturedFunction::Run", 0, 4, t + 3 * MS, t + (sleep_ms + 3) * MS),
            ("Iterator::Root::Map::Prefetch::Repeat[0]::ParallelMapV2", 0, 6, t + 40 * MS, t + 42 * MS),
            ("Iterator::Root::Map::Prefetch::Repeat[0]::ParallelMapV2::BatchV2", 0, 6, t + 40 * MS, t + 41 * MS),
        ]
    return events(rows)


def test_the_sleeping_map_is_the_slowest_stage_not_the_forwarding_generator():
    trace = distributed_input_trace(steps=4, sleep_ms=30)
    self_ms = stage_self_ns(view_of(trace)) / MS
    assert self_ms["Iterator::Root::Map"] == pytest.approx(4 * (31 - 0.2))  # minus its nested Prefetch
    assert self_ms["Iterator::Root::Generator"] == pytest.approx(4 * 5)  # 36 ms minus the 31 ms it waited
    assert self_ms["Iterator::Root::Map::Prefetch::Repeat[0]::ParallelMapV2"] == pytest.approx(4 * 1)
    assert slowest_input_stage(trace, 4) == "Iterator::Root::Map (30.80 ms self time per step)"


def test_a_pipeline_that_prefetches_is_not_told_to_prefetch():
    trace = distributed_input_trace()
    assert prefetches(trace) is True
    assert prefetches(events([("Iterator::Root::Map", 0, 0, 0, 5)])) is False
    assert prefetches(events([("Other", 0, 0, 0, 5)])) is None
    mean = {"step_ms": 40.0, "input_ms": 30.0, "compute_ms": 8.0, "host_ms": 2.0, "input_pct": 75.0,
            "compute_pct": 20.0, "host_pct": 5.0}
    told = make_verdict(mean, facts_from_mean({**mean, "prefetches": True,
                                               "slowest_input_stage": "Iterator::Root::Map (30 ms)"}), steps_used=5)
    assert told["bound"] == "input" and "Iterator::Root::Map" in told["advice"][0]
    assert not any(".prefetch(" in line for line in told["advice"]), told["advice"]
    unknown = make_verdict(mean, facts_from_mean(mean), steps_used=5)
    assert any(".prefetch(" in line for line in unknown["advice"])


def test_a_generator_handing_out_a_shard_only_waits():
    """tf.distribute's Generator waits on the multi-device iterator (GetNextFromShard) while its buffer
    is full: none of that is the pipeline's work."""
    rows = []
    for k in range(3):
        t = k * 100 * MS
        rows += [("Iterator::Root::Prefetch::Generator", 0, 4, t, t + 22 * MS),
                 ("GetNextFromShard0", 0, 5, t + 21 * MS, t + 21 * MS + MS // 10),
                 ("Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2", 0, 7, t + 30 * MS, t + 31 * MS)]
    self_ms = stage_self_ns(view_of(events(rows))) / MS
    assert self_ms["Iterator::Root::Prefetch::Generator"] == 0
    assert self_ms["Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2"] == pytest.approx(3.0)
    assert slowest_input_stage(events(rows), 3).startswith("Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2")


def test_advice_fits_the_slowest_stage():
    from analysis.breakdown.input_stages import runs_python
    from analysis.rules.table import stage_advice

    assert "num_parallel_calls" in stage_advice(SlowestStage("Iterator::Root::Map", 30.0))
    assert "vectorize" in stage_advice(SlowestStage("Iterator::Root::Prefetch::ParallelMapV2", 1.0))
    assert "cache" in stage_advice(SlowestStage("Iterator::Root::TFRecord", 1.0))
    assert "GIL" in stage_advice(SlowestStage("Iterator::Root::Map", 1.0, runs_python=True))
    trace = distributed_input_trace()
    assert runs_python(view_of(trace), "Iterator::Root::Map") is False
    with_python = pd.concat([trace, events([("PyFunc", 0, 4, 10 * MS, 20 * MS)])], ignore_index=True)
    with_python["name"] = with_python["name"].astype(str).astype("category")
    assert runs_python(view_of(with_python), "Iterator::Root::Map") is True
    assert runs_python(view_of(with_python), "Iterator::Root::Generator") is False
