"""tf.data stage self time: nesting on one thread, waiting on another pipeline (as traced by
tf.distribute) or on a stage's own producer thread, and the advice that names only stages the
pipeline has."""

import pandas as pd
import pytest

from analysis import analyze
from analysis.breakdown import input_stages as stages_mod
from analysis.breakdown.input_stages import SlowestStage, stage_self_ns
from analysis.rules.advice_loop import pipeline_is_the_cause
from analysis.rules.table import make_verdict
from input_traces import MS, PY_SLEEP_MS, write_prefetched_map_loop
from views import facts_from_mean, view_of


def events(rows):
    frame = pd.DataFrame(rows, columns=["name", "plane", "line", "start_ns", "end_ns"])
    frame["duration_ns"] = frame["end_ns"] - frame["start_ns"]
    frame["name"] = frame["name"].astype("category")
    frame["plane_name"] = "/host:CPU"
    return frame


def steps_of(count, step_ms=100):
    return pd.DataFrame(
        {"start_ns": [k * step_ms * MS for k in range(count)], "end_ns": [(k + 1) * step_ms * MS for k in range(count)]}
    )


def slowest_input_stage(frame, steps):
    return str(stages_mod.slowest_in_table(stages_mod.input_stage_table(view_of(frame), steps_of(steps)), steps))


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
    # Its slow Map reads from the prefetch: the loop reads from a stage that is not prefetched.
    assert prefetches(trace) is False
    assert prefetches(events([("Iterator::Root::Map", 0, 0, 0, 5)])) is False
    assert (
        prefetches(events([("Iterator::Root::Prefetch", 0, 0, 0, 5), ("Iterator::Root::Prefetch::Map", 0, 1, 0, 5)]))
        is True
    )
    assert prefetches(events([("Iterator::Model::MaxIntraOpParallelism::Prefetch", 0, 0, 0, 5)])) is True
    assert prefetches(events([("Other", 0, 0, 0, 5)])) is None
    # a take, repeat, skip or shard after the prefetch passes its batches on: still prefetched
    for after in ("FiniteTake", "ForeverRepeat", "FiniteSkip", "Shard"):
        assert (
            prefetches(
                events(
                    [
                        (f"Iterator::Root::{after}", 0, 0, 0, 5),
                        (f"Iterator::Root::{after}::Prefetch", 0, 1, 0, 5),
                        (f"Iterator::Root::{after}::Prefetch::Map", 0, 2, 0, 5),
                    ]
                )
            )
            is True
        ), after
    assert (
        prefetches(
            events([("Iterator::Root::FiniteTake", 0, 0, 0, 5), ("Iterator::Root::FiniteTake::Map", 0, 1, 0, 5)])
        )
        is False
    )
    mean = {
        "step_ms": 40.0,
        "input_ms": 30.0,
        "compute_ms": 8.0,
        "host_ms": 2.0,
        "input_pct": 75.0,
        "compute_pct": 20.0,
        "host_pct": 5.0,
    }
    told = make_verdict(
        mean,
        facts_from_mean({**mean, "prefetches": True, "slowest_input_stage": "Iterator::Root::Map (30 ms)"}),
        steps_used=5,
    )
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
        rows += [
            ("Iterator::Root::Prefetch::Generator", 0, 4, t, t + 22 * MS),
            ("GetNextFromShard0", 0, 5, t + 21 * MS, t + 21 * MS + MS // 10),
            ("Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2", 0, 7, t + 30 * MS, t + 31 * MS),
        ]
    self_ms = stage_self_ns(view_of(events(rows))) / MS
    assert self_ms["Iterator::Root::Prefetch::Generator"] == 0
    assert self_ms["Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2"] == pytest.approx(3.0)
    assert slowest_input_stage(events(rows), 3).startswith("Iterator::Root::Prefetch::ForeverRepeat[0]::BatchV2")


def test_advice_fits_the_slowest_stage():
    from analysis.breakdown.input_stages import runs_python
    from analysis.rules.advice_loop import stage_advice

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


# ------------------------------------------------------------------ a stage waiting on its own producer


def _stage_rows(data):
    return {row["stage"]: row for row in data["input_stages"]}


def test_the_map_whose_function_sleeps_holds_the_wait_not_the_prefetch_above_it(tmp_path):
    """The reported trace's shape: the loop waits ~50 ms per step at `Prefetch`, whose producer thread
    runs the map. The prefetch only waits; the map is named, with the wait it holds (at most the
    step's wait, close to its function's 50 ms), and the advice names no stage the pipeline lacks."""
    data = analyze(write_prefetched_map_loop(tmp_path / "h.xplane.pb")).to_json()
    wait = data["mean"]["input_wait_ms"]
    rows = _stage_rows(data)
    slow = rows["Iterator::Root::Prefetch::MapAndBatch"]
    assert slow["wait_ms_per_step"] <= wait + 1e-9
    assert slow["wait_ms_per_step"] == pytest.approx(PY_SLEEP_MS, rel=0.35)
    assert slow["ms_per_batch"] == pytest.approx(51.8 - 0.005, abs=1e-6)  # less its Range, pulled on the runner
    prefetch = rows["Iterator::Root::Prefetch"]
    assert prefetch["ms_per_batch"] == 0 and prefetch["wait_ms_per_step"] == 0
    for row in data["input_stages"]:  # no stage holds more than the step waits
        assert row["wait_ms_per_step"] <= wait + 1e-9, row
    assert data["input_stages"][0]["stage"] == slow["stage"]
    assert data["input_bottleneck"]["stage"] == "Iterator::Root::Prefetch::MapAndBatch"
    advice = data["verdict"]["advice"]
    assert "Iterator::Root::Prefetch::MapAndBatch" in advice[0] and "GIL" in advice[0], advice
    said = " ".join(advice + [data["verdict"]["evidence"]])
    assert "Prefetch stage" not in said and "interleave" not in said and ".prefetch(" not in said, said


def test_a_pipeline_whose_stages_are_fast_names_no_stage_as_the_cause(tmp_path):
    """The loop waits 10 ms of each 12 ms step at `Prefetch` while its producer's map takes 0.5 ms a batch
    (the thread got no CPU, say): waiting is not work, so no stage explains the wait and none is named."""
    path = write_prefetched_map_loop(tmp_path / "h.xplane.pb", map_ms=0.5, py_ms=0.3, wait_ms=10.0, period_ms=12.0)
    result = analyze(path)
    data = result.to_json()
    assert data["mean"]["input_wait_ms"] == pytest.approx(10.1, abs=1e-6)  # material: most of the step
    assert result.facts.slowest_input_stage.ms_per_step < 1.0
    assert not pipeline_is_the_cause(result.facts)
    assert data["input_bottleneck"] is None
    assert not any("slowest tf.data stage" in line for line in data["verdict"]["advice"]), data["verdict"]["advice"]
    for row in data["input_stages"]:
        assert row["wait_ms_per_step"] <= 0.5, row


def _advice_for(kinds, prefetches=True, stage=None):
    mean = {
        "step_ms": 40.0,
        "input_ms": 30.0,
        "compute_ms": 8.0,
        "host_ms": 2.0,
        "input_pct": 75.0,
        "compute_pct": 20.0,
        "host_pct": 5.0,
    }
    facts = facts_from_mean(
        {
            **mean,
            "prefetches": prefetches,
            "input_stage_kinds": kinds,
            "producer": "tensorflow",
            **({"slowest_input_stage": stage} if stage else {}),
        }
    )
    verdict = make_verdict(mean, facts, steps_used=5)
    assert verdict["bound"] == "input", verdict
    return " ".join([verdict["fix"] if "fix" in verdict else "", *verdict["advice"]])


def test_advice_names_only_stages_the_pipeline_has():
    # Slices of in-memory tensors, batched and prefetched: no map, no files, nothing worth caching.
    sliced = _advice_for(("Prefetch", "BatchV2", "TensorSlice"))
    assert "interleave" not in sliced and ".cache()" not in sliced and "its map" not in sliced, sliced
    assert "Add a parallel map" in sliced
    # A serial map over a range: parallelise it; no files to interleave.
    mapped = _advice_for(("Prefetch", "MapAndBatch", "Range"))
    assert "Parallelize its map" in mapped and "interleave" not in mapped, mapped
    # Already parallel, reading files in parallel, cached: none of those is advised again.
    done = _advice_for(
        (
            "Prefetch",
            "ParallelMapV2",
            "MemoryCache",
            "MemoryCacheImpl",
            "ParallelInterleaveV4",
            "FlatMap",
            "TFRecord",
            "TensorSlice",
        )
    )
    assert ".cache()" not in done and "interleave" not in done and "Parallelize its map" not in done, done
    assert "already runs in parallel" in done
    # Files read one at a time: read several at once.
    assert "interleave" in _advice_for(("Prefetch", "Map", "FlatMap", "TFRecord", "TensorSlice"))
    # Stages unknown (no tf.data events): the generic advice, said as what to add.
    unknown = _advice_for(None, prefetches=None)
    assert "Add `.prefetch(" in unknown and "add `num_parallel_calls" in unknown and "Add `.cache()`" in unknown


def test_the_verdicts_fix_names_only_stages_the_pipeline_has():
    from analysis.rules.advice_loop import _input_fix

    mean = {"input_pct": 75.0, "compute_pct": 20.0, "host_pct": 5.0, "producer": "tensorflow"}
    fix = _input_fix(
        facts_from_mean({**mean, "prefetches": True, "input_stage_kinds": ("Prefetch", "BatchV2", "TensorSlice")})
    )
    assert "its map" not in fix and ".cache()" not in fix and "add a parallel .map" in fix, fix
    fix = _input_fix(facts_from_mean({**mean, "prefetches": False, "input_stage_kinds": ("MapAndBatch", "Range")}))
    assert "parallelise its map" in fix and ".prefetch(" in fix and "interleave" not in fix, fix


def test_stage_advice_names_no_stage_the_pipeline_lacks():
    from analysis.rules.advice_loop import stage_advice

    prefetch = stage_advice(SlowestStage("Iterator::Root::Prefetch", 1.0))
    assert "after this Prefetch stage" not in prefetch and ".cache()" not in prefetch, prefetch
    for source in ("Iterator::Root::Prefetch::BatchV2::Range", "Iterator::Root::BatchV2::TensorSlice"):
        said = stage_advice(SlowestStage(source, 1.0))
        assert "interleave" not in said and "files" not in said, said
    assert "interleave" in stage_advice(SlowestStage("Iterator::Root::FlatMap[0]::TFRecord", 1.0))
    assert "from_generator" in stage_advice(SlowestStage("Iterator::Root::FlatMap[0]::Generator", 1.0))
    assert "from_generator" not in stage_advice(SlowestStage("Iterator::Root::Generator", 1.0))  # tf.distribute's


@pytest.mark.slow
def test_a_real_pipeline_names_the_map_whose_python_function_sleeps(tmp_path):
    """range -> map(py_function sleeping 50 ms) -> batch -> prefetch, a trivial tf.function step, traced
    by TensorFlow's profiler with step markers: the map holds the wait, within it and close to 50 ms."""
    import time

    import tensorflow as tf

    def slow(x):
        def sleep(value):
            time.sleep(PY_SLEEP_MS / 1e3)
            return value

        return tf.py_function(sleep, [x], tf.int64)

    dataset = tf.data.Dataset.range(1000).map(slow).batch(1).prefetch(tf.data.AUTOTUNE)
    total = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step(x):
        total.assign_add(tf.reduce_sum(x))
        return total

    iterator = iter(dataset)
    for _ in range(2):
        step(next(iterator)).numpy()
    tf.profiler.experimental.start(str(tmp_path))
    try:
        for k in range(2, 10):
            with tf.profiler.experimental.Trace("train", step_num=k, _r=1):
                step(next(iterator)).numpy()
    finally:
        tf.profiler.experimental.stop()
    data = analyze(tmp_path).to_json()
    kind = {row["stage"]: row["stage"].rsplit("::", 1)[-1].split("[")[0] for row in data["input_stages"]}
    for row in data["input_stages"]:
        if kind[row["stage"]] == "Prefetch":
            assert row["ms_per_batch"] < 1.0, row  # it waits for its producer thread, it does not work
    stage = data["input_bottleneck"]
    assert stage is not None and kind[stage["stage"]] in ("Map", "MapAndBatch", "ParallelMapV2"), data["input_stages"]
    wait = data["mean"]["input_wait_ms"]
    held = _stage_rows(data)[stage["stage"]]["wait_ms_per_step"]
    assert held <= wait + 1e-9 and held == pytest.approx(PY_SLEEP_MS, rel=0.35), (held, wait)
    for row in data["input_stages"]:
        assert row["wait_ms_per_step"] <= wait + 1e-9, row
    advice = " ".join(data["verdict"]["advice"])
    assert "Prefetch stage" not in advice and "interleave" not in advice, advice
