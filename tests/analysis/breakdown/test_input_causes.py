"""Input split by its cause, and eager execution named, on traces of known nanoseconds.

A GPU step that opens with its batch's host-to-device copy, with no kernel beside it, waits for
the copy: that is input, but its cure is prefetching to the device and fewer bytes, not the
tf.data pipeline. Ops run eagerly from Python (`EagerLocalExecute: <op>`) cost the step their
whole dispatch, one op at a time. Each fixture below puts known times there and checks that
every figure, and the advice that follows from it, says so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis import analyze
from analysis.breakdown.eager import EagerOps
from analysis.breakdown.input_parts import with_input_parts
from analysis.render import render
from analysis.rules import table as rules
from analysis.rules.finding_rules import findings
from trace_fixtures import ABSOLUTE_BASE_NS, _ns, _Plane, _write_space, _xspace_class
from views import facts_from_mean

MS = 1_000_000
EXACT_MS = 1e-6


def write_copy_loop(
    path: str | Path,
    *,
    steps: int = 6,
    step_ms: float = 13.5,
    wait_ms: float = 0.05,
    copy_ms: float = 1.29,
    kernels_ms: tuple[float, ...] = (6.0, 5.0),
    stage: tuple[str, float] = ("Iterator::Root::BatchV2::TensorSlice", 0.06),
) -> Path:
    """A custom TensorFlow loop on one CUDA GPU whose step k, [T + k * step, +step), opens with
    `IteratorGetNext` for `wait_ms`; right as it returns, the batch's `MemcpyH2D` runs for `copy_ms`
    on the copy stream with no kernel beside it; then the step's kernels run one after another.
    The tf.data `stage` (name, ms of own time) runs on a tf.data thread inside the wait."""
    space = _xspace_class()()
    space.hostnames.append("copy-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", ABSOLUTE_BASE_NS)
    tf_data = host.line(2, "tf_data_iterator_get_next", ABSOLUTE_BASE_NS)
    gpu = _Plane(space, 1, "/device:GPU:0")
    compute = gpu.line(7, "Stream #7(Compute)", ABSOLUTE_BASE_NS)
    copies = gpu.line(8, "Stream #8(MemcpyH2D)", ABSOLUTE_BASE_NS)
    correlation = 100
    for k in range(steps):
        t = ABSOLUTE_BASE_NS + 2 * MS + k * _ns(step_ms)
        host.event(python, "train", t, t + _ns(step_ms) - 50_000, step_num=k, _r=1)
        host.event(python, "IteratorGetNext", t, t + _ns(wait_ms))
        host.event(tf_data, stage[0], t, t + _ns(stage[1]))
        copy_at = t + _ns(wait_ms)
        host.event(python, "cuMemcpyHtoDAsync_v2", copy_at, copy_at + 5_000, correlation_id=correlation)
        gpu.event(copies, "MemcpyH2D", copy_at, copy_at + _ns(copy_ms), correlation_id=correlation)
        correlation += 1
        at = copy_at + _ns(copy_ms)
        for j, length in enumerate(kernels_ms):
            host.event(
                python,
                "cuLaunchKernel",
                copy_at + 10_000 * (j + 1),
                copy_at + 10_000 * (j + 1) + 5_000,
                correlation_id=correlation,
            )
            gpu.event(compute, f"volta_sgemm_{j}", at, at + _ns(length), correlation_id=correlation)
            at += _ns(length)
            correlation += 1
    host.finish()
    gpu.finish()
    return _write_space(space, path)


def _advice(data: dict) -> str:
    return " ".join([*data["verdict"]["advice"], *(f["advice"] for f in data["findings"])])


# ------------------------------------------------------------------ the copy that is the input


def test_an_exposed_copy_is_input_copy_and_the_wait_is_apart(tmp_path):
    """The step of a real GPU trace: 1.29 ms of copy no kernel overlaps in a 13.5 ms step, the host
    waiting 0.05 ms for the iterator. Both are input; each is named with its own time."""
    data = analyze(write_copy_loop(tmp_path / "h.xplane.pb")).to_json()
    for step in data["steps"]:
        assert step["input_copy_ms"] == pytest.approx(1.29, abs=EXACT_MS), step
        assert step["input_wait_ms"] == pytest.approx(0.05, abs=EXACT_MS), step
        assert step["input_wait_ms"] + step["input_copy_ms"] == pytest.approx(step["input_ms"], abs=EXACT_MS)
    mean = data["mean"]
    assert mean["input_copy_ms"] == pytest.approx(1.29, abs=EXACT_MS)
    assert mean["input_wait_ms"] == pytest.approx(0.05, abs=EXACT_MS)
    assert mean["input_ms"] == pytest.approx(1.34, abs=EXACT_MS)
    (device,) = data["devices"]
    assert device["input_copy_ms"] == pytest.approx(1.29, abs=EXACT_MS)
    assert device["input_wait_ms"] == 0.0
    assert device["input_wait_ms"] + device["input_copy_ms"] == pytest.approx(device["input_ms"], abs=EXACT_MS)


def test_advice_for_an_exposed_copy_is_the_copys_not_the_pipelines(tmp_path):
    data = analyze(write_copy_loop(tmp_path / "h.xplane.pb")).to_json()
    verdict = data["verdict"]
    # The kernels hold the step; the exposed copy is its largest fix, said beside the bound.
    assert verdict["bound"] == "compute" and verdict["first_fix"]["rule"] == "input_copy", verdict
    assert "hiding the batch copy" in verdict["evidence"], verdict["evidence"]
    assert "prefetch_to_device" in verdict["advice"][0], verdict["advice"]
    advice = _advice(data)
    assert "uint8" in advice and "pinned" in advice and "experimental_fetch_to_device" in advice
    # The pipeline is not the cause: no stage advice, no tf.data advice, no prefetch finding.
    assert "TensorSlice" not in advice, advice
    assert ".cache()" not in advice and "num_parallel_calls" not in advice, advice
    assert "no_prefetch" not in [f["rule"] for f in data["findings"]]
    assert data["input_bottleneck"] is None


def test_a_material_wait_keeps_the_pipeline_advice_and_the_stage_that_explains_it(tmp_path):
    """4 ms waiting for a pipeline whose Map stage takes 3.5 ms of its own per batch, 0.3 ms of
    exposed copy: the wait dominates, and the stage explains it."""
    path = write_copy_loop(
        tmp_path / "h.xplane.pb", wait_ms=4.0, copy_ms=0.3, kernels_ms=(5.0, 4.0), stage=("Iterator::Root::Map", 3.5)
    )
    data = analyze(path).to_json()
    assert data["mean"]["input_wait_ms"] == pytest.approx(4.0, abs=EXACT_MS)
    assert data["mean"]["input_copy_ms"] == pytest.approx(0.3, abs=EXACT_MS)
    verdict = data["verdict"]
    assert verdict["first_fix"]["rule"] == "input_wait" and "waits for batches" in verdict["first_fix"]["advice"]
    assert "Iterator::Root::Map" in verdict["advice"][0] and "num_parallel_calls" in verdict["advice"][0]
    assert not any("prefetch_to_device" in line for line in verdict["advice"])
    assert "no_prefetch" in [f["rule"] for f in data["findings"]]
    assert data["input_bottleneck"]["stage"] == "Iterator::Root::Map"


def test_a_stage_whose_own_time_does_not_explain_the_wait_is_not_blamed(tmp_path):
    """4 ms of wait, and the only stage takes 0.06 ms: the general pipeline advice, not the stage's."""
    data = analyze(write_copy_loop(tmp_path / "h.xplane.pb", wait_ms=4.0, copy_ms=0.3, kernels_ms=(5.0, 4.0))).to_json()
    advice = data["verdict"]["advice"]
    assert not any("TensorSlice" in line for line in advice), advice
    assert data["input_bottleneck"] is None
    assert any("num_parallel_calls" in line for line in advice)
    assert "no_prefetch" in [f["rule"] for f in data["findings"]]


def test_every_format_states_the_split(tmp_path):
    result = analyze(write_copy_loop(tmp_path / "h.xplane.pb"))
    for fmt in ("text", "markdown", "html", "json"):
        rendered = " ".join(render(result, fmt).split())  # the terminal's text is wrapped
        assert "0.05 ms waiting for the iterator" in rendered and "1.29 ms copying to the device" in rendered, fmt
    header = render(result, "csv").splitlines()[0].split(",")
    assert {"input_wait_ms", "input_copy_ms"} <= set(header)


def test_without_a_trace_all_input_is_the_wait():
    """steps.csv times the loop's call of its iterator: no copy is in it."""
    steps = pd.DataFrame({"step": [0, 1], "start_ns": [0, 10], "end_ns": [10, 20], "input_ms": [1.5, 0.25]})
    split = with_input_parts(None, steps)
    assert split["input_wait_ms"].tolist() == [1.5, 0.25] and split["input_copy_ms"].tolist() == [0.0, 0.0]


def test_no_prefetch_is_said_only_where_the_wait_is_material():
    mean = {"input_pct": 9.9, "compute_pct": 80.0, "host_pct": 10.1, "prefetches": False}
    assert "no_prefetch" not in [
        f["rule"] for f in findings(facts_from_mean({**mean, "input_wait_pct": 0.4, "input_copy_pct": 9.5}))
    ]
    assert "no_prefetch" in [
        f["rule"] for f in findings(facts_from_mean({**mean, "input_wait_pct": 9.9, "input_copy_pct": 0.0}))
    ]
    # Unknown split (a compare row): all input is taken for the wait.
    assert "no_prefetch" in [f["rule"] for f in findings(facts_from_mean(mean))]
    assert "no_prefetch" not in [f["rule"] for f in findings(facts_from_mean({**mean, "input_pct": 2.0}))]


# ------------------------------------------------------------------ eager execution


def write_eager_loop(
    path: str | Path,
    *,
    steps: int = 6,
    step_ms: float = 20.0,
    function: str | None = "__inference_train_step_42",
    eager: tuple[tuple[str, float, float], ...] = (("LogicalAnd", 8.0, 4.0), ("Mul", 12.5, 1.0)),
) -> Path:
    """A CPU loop with markers `train` back to back, `step_ms` each. In each step: the iterator's
    `EagerLocalExecute: IteratorGetNext` (1 ms, input), the compiled step's call (6 ms, from 1 ms),
    and the eager ops `eager` as (op, start ms, duration ms)."""
    space = _xspace_class()()
    space.hostnames.append("eager-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", ABSOLUTE_BASE_NS)
    for k in range(steps):
        t = ABSOLUTE_BASE_NS + MS + k * _ns(step_ms)
        host.event(python, "train", t, t + _ns(step_ms), step_num=k, _r=1)
        host.event(python, "EagerLocalExecute: IteratorGetNext", t, t + MS)
        host.event(python, "IteratorGetNext", t + 100_000, t + MS - 100_000)
        if function:
            host.event(python, f"EagerLocalExecute: {function}", t + MS, t + 7 * MS)
        for op, start, length in eager:
            host.event(python, f"EagerLocalExecute: {op}", t + _ns(start), t + _ns(start + length))
    host.finish()
    return _write_space(space, path)


def test_eager_ops_are_named_with_their_share_and_time(tmp_path):
    data = analyze(write_eager_loop(tmp_path / "h.xplane.pb")).to_json()
    eager = data["eager"]
    assert eager["op_time_pct"] == pytest.approx(100 * 5 / 11, abs=1e-9)  # 5 ms eager of 5 + 6 ms op time
    assert eager["ms_per_step"] == pytest.approx(5.0, abs=EXACT_MS)
    assert eager["step_pct"] == pytest.approx(25.0, abs=1e-9)
    assert eager["ops"] == [
        {"op": "LogicalAnd", "ms_per_step": pytest.approx(4.0, abs=EXACT_MS)},
        {"op": "Mul", "ms_per_step": pytest.approx(1.0, abs=EXACT_MS)},
    ]
    (finding,) = [f for f in data["findings"] if f["rule"] == "eager_execution"]
    assert "45 % of the host's op time" in finding["evidence"] and "`LogicalAnd` 4.00 ms" in finding["evidence"]
    assert "tf.function" in finding["advice"]


def test_eager_advice_fits_the_program(tmp_path):
    keras = analyze(write_eager_loop(tmp_path / "k.xplane.pb", function="__inference_train_function_9")).to_json()
    (finding,) = [f for f in keras["findings"] if f["rule"] == "eager_execution"]
    assert "steps_per_execution" in finding["advice"]
    only_eager = analyze(write_eager_loop(tmp_path / "e.xplane.pb", function=None)).to_json()
    assert only_eager["eager"]["op_time_pct"] == 100.0
    (finding,) = [f for f in only_eager["findings"] if f["rule"] == "eager_execution"]
    assert "wrap the training step in `tf.function`" in finding["advice"]
    # Keras with every op eager: the model was compiled with run_eagerly=True.
    all_eager = facts_from_mean({"producer": "keras", "eager": EagerOps(100.0, 50.0, 60.0, (("MatMul", 20.0),))})
    assert "run_eagerly=False" in rules.RULES_BY_ID["eager_execution"].fix(all_eager)


def test_a_little_eager_work_is_not_a_finding(tmp_path):
    """0.2 ms of eager ops in a 20 ms step (1 %): reported in the JSON, not a finding."""
    data = analyze(write_eager_loop(tmp_path / "h.xplane.pb", eager=(("LogicalAnd", 8.0, 0.2),))).to_json()
    assert data["eager"]["step_pct"] == pytest.approx(1.0, abs=1e-9)
    assert "eager_execution" not in [f["rule"] for f in data["findings"]]


def test_a_compiled_loop_has_no_eager_ops(tmp_path):
    data = analyze(write_eager_loop(tmp_path / "h.xplane.pb", eager=())).to_json()
    assert data["eager"] is None


def write_eager_gpu_loop(
    path: str | Path,
    *,
    steps: int = 6,
    step_ms: float = 20.0,
    gpu: bool = True,
    grouped: bool = False,
    markers: bool = True,
) -> Path:
    """A loop with markers `train`, `step_ms` each, as newer TensorFlow records it (no `is_eager`
    stats: XProf's grouping decides); `grouped`, as TensorFlow 2.5 did, grouped at capture: the
    `is_eager` stats say which op ran eagerly, no call says `is_func`, kernels name their op in
    `level 0`. Per step, on the Python thread, each call inside an
    `EagerExecute` (`is_func` 0 for an op, 1 for the tf.function): the iterator's call [0, 1) ms
    holding its op `IteratorGetNext:IteratorGetNext` [0.1, 0.9) and tf.data's `Iterator::Root`
    [0.2, 0.8); the compiled step's call [1, 7); `LogicalAnd` [8, 12) holding its op [9, 11); `Mul`
    [12.5, 13.5). On an executor thread the function's op `model/dense/MatMul:MatMul` [2, 3). With
    `gpu`, MatMul's launch (on the executor thread) runs a 2 ms kernel and Mul's (under its eager
    call) a 1 ms kernel, each with its `tf_op`, and a 0.3 ms input copy (no op) runs beside them.
    Without `markers`, no step marker and no `group_id`: a capture in which TensorFlow found no step.

    devprof's share: 5 ms of eager calls of 5 + 6 ms (45 %). TensorFlow's: host op self time 0.2
    (IteratorGetNext, eager) + 0.6 (the tf.data stage) + 1 (MatMul) + 2 (LogicalAnd, eager) ms, so
    2.2 of 3.8 ms eager; device 1 ms eager of 3 ms."""
    space = _xspace_class()()
    space.hostnames.append("eager-gpu-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", ABSOLUTE_BASE_NS)
    executor = host.line(2, "tf_Compute", ABSOLUTE_BASE_NS)
    device = _Plane(space, 1, "/device:GPU:0") if gpu else None
    stream = device.line(7, "Stream #7(Compute)", ABSOLUTE_BASE_NS) if device else None
    copies = device.line(8, "Stream #8(MemcpyH2D)", ABSOLUTE_BASE_NS) if device else None
    for k in range(steps):
        t = ABSOLUTE_BASE_NS + MS + k * _ns(step_ms)
        if markers:
            host.event(python, "train", t, t + _ns(step_ms), step_num=k, _r=1)
        for name, start, end, is_func in (
            ("IteratorGetNext", 0, 1, 0),
            ("__inference_train_step_42", 1, 7, 1),
            ("LogicalAnd", 8, 12, 0),
            ("Mul", 12.5, 13.5, 0),
        ):
            host.event(
                python, "EagerExecute", t + _ns(start), t + _ns(end), **({} if grouped else {"is_func": is_func})
            )
            host.event(python, f"EagerLocalExecute: {name}", t + _ns(start), t + _ns(end))
        stat = (lambda eager: {"is_eager": eager}) if grouped else (lambda eager: {})
        op_stat = "level 0" if grouped else "tf_op"
        host.event(python, "IteratorGetNext:IteratorGetNext", t + _ns(0.1), t + _ns(0.9), **stat(1))
        host.event(python, "Iterator::Root", t + _ns(0.2), t + _ns(0.8))
        host.event(python, "LogicalAnd:LogicalAnd", t + _ns(9), t + _ns(11), **stat(1))
        host.event(
            executor,
            "ExecutorState::Process",
            t + _ns(1.5),
            t + _ns(6.5),
            **({"group_id": k} if grouped and markers else {}),
        )
        host.event(executor, "model/dense/MatMul:MatMul", t + _ns(2), t + _ns(3), **stat(0))
        if device:
            host.event(executor, "cudaLaunchKernel", t + _ns(2.2), t + _ns(2.3), correlation_id=2 * k + 10)
            host.event(python, "cudaLaunchKernel", t + _ns(12.7), t + _ns(12.8), correlation_id=2 * k + 11)
            device.event(
                stream,
                "volta_sgemm_128x64_nn",
                t + _ns(3),
                t + _ns(5),
                correlation_id=2 * k + 10,
                **{op_stat: "model/dense/MatMul:MatMul"},
                **stat(0),
            )
            device.event(
                stream,
                "EigenMetaKernel",
                t + _ns(13),
                t + _ns(14),
                correlation_id=2 * k + 11,
                **{op_stat: "Mul:Mul"},
                **stat(1),
            )
            device.event(copies, "MemcpyH2D", t + _ns(1.1), t + _ns(1.4))
    host.finish()
    if device:
        device.finish()
    return _write_space(space, path)


@pytest.mark.parametrize("grouped", [False, True], ids=["grouped-by-xprof", "grouped-at-capture"])
def test_eager_share_on_tensorflows_definition(tmp_path, grouped):
    """TensorFlow's overview page weighs the ops' own time, and a GPU op on the device: its shares
    differ from devprof's, and both are given, with why. (XProf's converter gives 57.9 % and 33.3 %
    on this trace.)"""
    data = analyze(write_eager_gpu_loop(tmp_path / "g.xplane.pb", grouped=grouped)).to_json()
    eager = data["eager"]
    assert eager["op_time_pct"] == pytest.approx(100 * 5 / 11, abs=1e-9)
    assert eager["host_op_time_eager_pct"] == 100 * 22 / 38
    assert eager["device_op_time_eager_pct"] == 100 / 3
    (finding,) = [f for f in data["findings"] if f["rule"] == "eager_execution"]
    assert "45 % of the host's op time runs eagerly" in finding["evidence"]
    assert (
        "On TensorFlow's definition (its overview page's), 57.9 % of host and 33.3 % of device op time ran "
        "eagerly: it weighs only the op events TensorFlow records"
    ) in finding["evidence"], finding["evidence"]


def test_eager_share_on_tensorflows_definition_without_steps(tmp_path):
    """A capture grouped by TensorFlow that found no step (no marker, no group_id; its `is_eager` stats
    written all the same): the window is one step, and TensorFlow's shares are its stats', as with steps."""
    data = analyze(write_eager_gpu_loop(tmp_path / "w.xplane.pb", grouped=True, markers=False)).to_json()
    assert data["step_source"] == "window", data["step_source"]
    assert data["eager"]["host_op_time_eager_pct"] == 100 * 22 / 38
    assert data["eager"]["device_op_time_eager_pct"] == 100 / 3


def test_eager_share_on_tensorflows_definition_is_absent_where_not_recorded(tmp_path):
    """No device plane: TensorFlow's device share is not recorded (null, not 0 %); with no op
    event it counts on the host either, neither share is."""
    cpu = analyze(write_eager_gpu_loop(tmp_path / "c.xplane.pb", gpu=False)).to_json()
    assert cpu["eager"]["host_op_time_eager_pct"] == 100 * 22 / 38
    assert cpu["eager"]["device_op_time_eager_pct"] is None
    (finding,) = [f for f in cpu["findings"] if f["rule"] == "eager_execution"]
    assert "57.9 % of host op time ran eagerly (no device op recorded)" in finding["evidence"], finding["evidence"]
    bare = analyze(write_eager_loop(tmp_path / "b.xplane.pb")).to_json()["eager"]
    assert (
        bare["op_time_pct"] > 0 and bare["host_op_time_eager_pct"] is None and bare["device_op_time_eager_pct"] is None
    )


# ------------------------------------------------------------------ eager execution, recorded with TensorFlow


def _record(logdir: Path, run) -> Path:
    import tensorflow as tf

    from trace_fixtures import find_xplane

    run(warm=True)
    tf.profiler.experimental.start(str(logdir))
    try:
        run(warm=False)
    finally:
        tf.profiler.experimental.stop()
    return find_xplane(logdir)


def _dataset():
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((256, 32), dtype=np.float32)
    y = (rng.random(256) > 0.5).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().prefetch(2)


@pytest.mark.slow
def test_keras_run_eagerly_is_named(tmp_path):
    """Keras `fit` with `run_eagerly=True`: every op of the step runs eagerly, none in a tf.function."""
    import keras

    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
    data = _dataset()
    trace = _record(tmp_path, lambda warm: model.fit(data, steps_per_epoch=3 if warm else 6, epochs=1, verbose=0))
    result = analyze(trace).to_json()
    eager = result["eager"]
    assert eager["op_time_pct"] == 100.0, eager
    # The heaviest ops are ops the trace ran eagerly (read here from the raw XSpace), heaviest first;
    # which of the step's many small ops are heaviest depends on the machine's load, so no names.
    space = _xspace_class()()
    space.ParseFromString(trace.read_bytes())
    ran = {
        m.name.removeprefix("EagerLocalExecute: ")
        for plane in space.planes
        for m in plane.event_metadata.values()
        if m.name.startswith("EagerLocalExecute: ")
    }
    assert {"MatMul", "ReadVariableOp"} <= ran, ran  # the Dense layers ran op by op
    listed = [op["op"] for op in eager["ops"]]
    assert len(listed) == 3 and set(listed) <= ran and not any(name.startswith("__inference") for name in listed), (
        listed,
        ran,
    )
    times = [op["ms_per_step"] for op in eager["ops"]]
    assert times == sorted(times, reverse=True) and 0 < sum(times) <= eager["ms_per_step"], eager
    assert "eager_execution" in [f["rule"] for f in result["findings"]]


@pytest.mark.slow
def test_an_eager_loop_around_one_tf_function_is_named(tmp_path):
    """A loop with markers whose gradient is a tf.function and whose other work (a 300x300 matmul
    chain, a check, the update) runs eagerly: most of its op time is eager, the function is not."""
    import keras
    import tensorflow as tf

    w = tf.Variable(tf.random.normal((32, 2), seed=1))
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, x @ w))
        return loss, tape.gradient(loss, [w])

    batches = iter(_dataset())
    counter = iter(range(100))

    def loop(warm):
        for _ in range(2 if warm else 6):
            with tf.profiler.experimental.Trace("train", step_num=next(counter), _r=1):
                x, y = next(batches)
                loss, grads = gradients(x, y)
                big = tf.random.normal((300, 300))
                for _ in range(3):
                    big = tf.matmul(big, big) / 300.0
                tf.logical_and(tf.reduce_all(tf.math.is_finite(big)), loss > -1.0)
                optimizer.apply_gradients(zip(grads, [w]))

    result = analyze(_record(tmp_path, loop)).to_json()
    eager = result["eager"]
    assert 50.0 < eager["op_time_pct"] < 100.0, eager  # the tf.function's calls are op time too
    names = [op["op"] for op in eager["ops"]]
    assert "MatMul" in names and not any(n.startswith("__inference") or "Iterator" in n for n in names), names
    (finding,) = [f for f in result["findings"] if f["rule"] == "eager_execution"]
    assert "MatMul" in finding["evidence"]


@pytest.mark.slow
def test_a_compiled_loop_is_not_called_eager():
    from trace_fixtures import find_xplane, trace_logdir

    result = analyze(find_xplane(trace_logdir("clean"))).to_json()
    assert "eager_execution" not in [f["rule"] for f in result["findings"]], result["eager"]


def test_xprof_reading_is_never_devprofs_input_under_xprofs_name(tmp_path):
    """An exposed 1.29 ms copy is 9.9 % of devprof's input; XProf's converter reads the same trace as
    NOT input-bound (its own grouping and classification): no sentence in XProf's name."""
    path = write_copy_loop(tmp_path / "h.xplane.pb")
    data = analyze(path).to_json()
    assert data["mean"]["input_pct"] > 5.0 and data["verdict"]["xprof_reading"] is None
    from xprof_oracle import xprof_steps

    _, summary = xprof_steps(path)
    assert "NOT input-bound" in summary["input_conclusion"], summary  # the oracle: XProf's own reading


def test_xprof_reading_written_at_capture_is_quoted_where_it_differs(tmp_path):
    from tf_analysis_fixtures import input_result, write_overview

    path = write_copy_loop(tmp_path / "plugins/profile/s/h.xplane.pb")
    said = "Your program is HIGHLY input-bound because 25.0% of the total step time sampled is waiting for input."
    write_overview(path, input_result(steps=6, step_ms=13.5, input_pct=25.0, hardware="GPU"), statement=said)
    verdict = analyze(path).to_json()["verdict"]
    assert verdict["bound"] == "compute" and verdict["xprof_reading"] == (
        f'XProf\'s Overview page, as TensorFlow wrote it at capture, reads: "{said}"'
    )
    agrees = "Your program is NOT input-bound because only 1.0% of the total step time sampled is waiting for input."
    write_overview(path, input_result(steps=6, step_ms=13.5, input_pct=1.0, hardware="GPU"), statement=agrees)
    assert analyze(path).to_json()["verdict"]["xprof_reading"] is None
