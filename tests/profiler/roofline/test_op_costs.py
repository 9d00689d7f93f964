"""op_costs.csv: FLOPs and bytes per op of the traced functions, written at capture by every
recording entry point (`devprof run`, `profiler.profile()`, `profiler.KerasCallback`), and its
reader. Numbers are checked against formulas worked out here from the model's layers."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.read import op_costs as reader
from analysis.read.op_costs import OP_COST_COLUMNS, OP_COSTS_CSV, read_op_costs
from analysis.read.run_files import RunFileWarning

BATCH = 8


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split("x")] if text else []


def _shapes(text: str) -> list[list[int]]:
    return [_dims(part) for part in text.split(";")]


# ---------------------------------------------------------------- the reader (no TensorFlow)


def _write(run: Path, text: str) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / OP_COSTS_CSV).write_text(text)
    return run


HEADER = ",".join(OP_COST_COLUMNS) + "\n"


def test_reader_returns_none_without_the_file(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_op_costs(tmp_path) is None


def test_reader_types_the_columns_and_blanks_what_is_not_a_cost(tmp_path):
    run = _write(
        tmp_path / "run",
        HEADER
        + "step,m/conv,Conv2D,float32,matrix,8x32x32x3;3x3x3x32,8x32x32x32,14155776,1163264,tensorflow,,\n"
        + "step,m/BiasAdd,BiasAdd,float32,vector,8x32x32x32;32,8x32x32x32,262144,2097280,tensorflow,"
        + "14417920,1150464\n"
        + "step,m/x,Mystery,,weird,,,-3,inf,guessed,nan,1e300\n"
        + "step,m/cut,Conv2D,float32,matrix,,,1,2,tensorflow,,",
    )  # no newline: cut mid-row
    with pytest.warns(RunFileWarning) as caught:
        frame = read_op_costs(run)
    assert frame is not None
    assert [str(w.message) for w in caught] == [
        f"{run / OP_COSTS_CSV}: 4 FLOPs or bytes are not a number from 0 to 1e+18: those ops' costs read as unknown"
    ]
    assert list(frame.columns) == OP_COST_COLUMNS and len(frame) == 3
    assert frame.loc[0, "flops"] == 14155776.0 and frame.loc[0, "bytes"] == 1163264.0
    assert math.isnan(frame.loc[0, "chain_flops"])
    assert frame.loc[1, "chain_flops"] == 14417920.0 and frame.loc[1, "chain_bytes"] == 1150464.0
    assert frame.loc[2, "kind"] == "" and frame.loc[2, "flops_source"] == ""  # values devprof never writes
    assert frame.loc[2, ["flops", "bytes", "chain_flops", "chain_bytes"]].isna().all()
    assert frame.loc[0, "input_shapes"] == "8x32x32x3;3x3x3x32" and frame.loc[2, "dtype"] == ""


@pytest.mark.parametrize("case", ["missing column", "folder", "too big", "empty"])
def test_reader_warns_once_and_gives_none_for_a_file_it_cannot_use(tmp_path, monkeypatch, case):
    run = tmp_path / "run"
    run.mkdir()
    if case == "missing column":
        _write(
            run,
            ",".join(c for c in OP_COST_COLUMNS if c != "bytes") + "\nstep,a,MatMul,float32,matrix,,,1,tensorflow,,\n",
        )
        expected = "missing columns bytes"
    elif case == "folder":
        (run / OP_COSTS_CSV).mkdir()
        expected = "a folder, not a regular file"
    elif case == "too big":
        _write(run, HEADER + "step,a,MatMul,float32,matrix,2x2;2x2,2x2,16,48,tensorflow,,\n")
        monkeypatch.setattr(reader, "CSV_MAX_BYTES", 10)
        expected = "above the"
    else:
        _write(run, "")
        expected = "empty file"
    with pytest.warns(RunFileWarning) as caught:
        assert read_op_costs(run) is None
    assert len(caught) == 1 and expected in str(caught[0].message) and "op costs skipped" in str(caught[0].message)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_reader_never_waits_on_a_fifo(tmp_path):
    os.mkfifo(tmp_path / OP_COSTS_CSV)
    with pytest.warns(RunFileWarning, match="a FIFO"):
        assert read_op_costs(tmp_path) is None


# ---------------------------------------------------------------- costs of the seed CNN's train step


@pytest.fixture(scope="module")
def seed_step():
    """The seed CNN's training step (GradientTape, Keras Adam), traced and run at batch 8."""
    import keras
    import tensorflow as tf

    from models.cnn import build_cnn

    model = build_cnn()
    optimizer = keras.optimizers.Adam()
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def seed_train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    x, y = np.zeros((BATCH, 32, 32, 3), np.float32), np.zeros((BATCH,), np.int32)
    seed_train_step(x, y)
    seed_train_step(x, y)
    return model, seed_train_step, seed_train_step.get_concrete_function(x, y).graph


@pytest.fixture(scope="module")
def seed_rows(seed_step):
    from profiler.roofline import op_costs

    return pd.DataFrame(op_costs.graph_rows(seed_step[2]), columns=OP_COST_COLUMNS)


def _conv_layers(model):
    import keras

    return [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]


@pytest.mark.slow
def test_every_convolution_and_its_backprops_have_the_formulas_flops(seed_step, seed_rows):
    model = seed_step[0]
    expected = sorted(
        2 * layer.output.shape[1] * layer.output.shape[2] * layer.filters * 3 * 3 * layer.input.shape[-1] * BATCH
        for layer in _conv_layers(model)
    )
    for op_type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"):
        rows = seed_rows[seed_rows["type"] == op_type]
        assert sorted(rows["flops"]) == expected, op_type  # one per layer, 2*H*W*Cout*kh*kw*Cin*batch
        assert (rows["kind"] == "matrix").all() and (rows["dtype"] == "float32").all()
    for _, row in seed_rows[seed_rows["type"] == "Conv2D"].iterrows():
        (n, h, w, cin), (kh, kw, _, cout) = _shapes(row["input_shapes"])
        assert row["flops"] == 2 * n * h * w * cout * kh * kw * cin  # SAME padding, stride 1: output H, W = input's
        assert row["bytes"] == 4 * (n * h * w * cin + kh * kw * cin * cout + n * h * w * cout)


@pytest.mark.slow
def test_the_steps_flops_add_up_to_the_models_training_flops(seed_step, seed_rows):
    from models.cnn import train_flops_per_image

    expected = train_flops_per_image(seed_step[0]) * BATCH
    total = seed_rows["flops"].sum()  # NaN (unknown) rows left out: the random numbers of Dropout
    # The convolutions and matmuls are the model's count exactly; bias, pooling, loss and Adam's
    # element-wise updates add 1.0 % (measured: 1,924,158,167 against 1,904,799,744).
    matrix = seed_rows.loc[seed_rows["kind"] == "matrix", "flops"].sum()
    assert matrix == expected
    assert expected < total < expected * 1.02


@pytest.mark.slow
def test_a_bias_add_after_a_convolution_carries_the_fused_chains_costs(seed_rows):
    by_name = seed_rows.set_index("op")
    ends = seed_rows[(seed_rows["type"] == "BiasAdd") & seed_rows["chain_flops"].notna()]
    assert len(ends) == 8  # six convolutions and two dense layers
    conv_ends = 0
    for _, row in ends.iterrows():
        conv = by_name.loc[
            [
                n
                for n in by_name.index
                if n.rsplit("/", 1)[0] == row["op"].rsplit("/", 1)[0] and by_name.loc[n, "type"] in ("Conv2D", "MatMul")
            ][0]
        ]
        assert row["chain_flops"] == conv["flops"] + row["flops"]
        out = math.prod(_dims(row["output_shapes"]))
        assert row["flops"] == out  # BiasAdd: one add per output element
        if conv["type"] == "Conv2D":
            conv_ends += 1
            (n, h, w, cin), (kh, kw, _, cout) = _shapes(conv["input_shapes"])
            # the fused op reads the image, the filter and the bias and writes the BiasAdd's output
            assert row["chain_bytes"] == 4 * (n * h * w * cin + kh * kw * cin * cout + cout + out)
    assert conv_ends == 6
    relu = seed_rows[seed_rows["type"] == "Relu"].iloc[0]  # Dense(128, relu): MatMul + BiasAdd + Relu
    bias = by_name.loc[relu["op"].rsplit("/", 1)[0] + "/BiasAdd"]
    assert relu["chain_flops"] == bias["chain_flops"] + relu["flops"]
    assert seed_rows.loc[seed_rows["type"] == "Conv2D", "chain_flops"].isna().all()


@pytest.mark.slow
def test_collect_finds_the_traced_function_without_being_told(seed_step):
    from profiler.roofline import op_costs

    frame = op_costs.collect()
    step = frame[frame["function"] == "seed_train_step"]
    assert (step["type"] == "Conv2DBackpropFilter").sum() == 6
    assert not frame.duplicated(["function", "op"]).any()
    assert set(frame["kind"]) <= {"matrix", "vector", ""}


@pytest.mark.slow
def test_formulas_of_ops_tensorflow_has_no_statistic_for():
    import tensorflow as tf

    from profiler.roofline import op_costs

    variable = tf.Variable(tf.zeros((4, 5)))
    m, v = tf.Variable(tf.zeros((4, 5))), tf.Variable(tf.zeros((4, 5)))

    @tf.function
    def formulas(a, b, images):
        c = tf.einsum("ij,jk->ik", a, b)  # 2 x 3 x 5 x 7
        d = tf.nn.relu(c)
        e = tf.reduce_max(d, axis=1)  # 3 x 7 input elements
        f = tf.cast(e, tf.float16)
        g = tf.nn.depthwise_conv2d(images, tf.ones((3, 3, 2, 1)), [1, 1, 1, 1], "SAME")
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=0.9,
            beta2_power=0.99,
            lr=0.1,
            beta1=0.9,
            beta2=0.99,
            epsilon=1e-7,
            grad=tf.ones((4, 5)),
        )
        return tf.reshape(f, [-1]), g

    graph = formulas.get_concrete_function(
        tf.TensorSpec((3, 5)), tf.TensorSpec((5, 7)), tf.TensorSpec((2, 6, 6, 2))
    ).graph
    rows = pd.DataFrame(op_costs.graph_rows(graph), columns=OP_COST_COLUMNS).set_index("type")
    assert rows.loc["Einsum", ["flops", "flops_source", "kind"]].tolist() == [2 * 3 * 5 * 7, "formula", "matrix"]
    assert rows.loc["Relu", ["flops", "flops_source", "kind"]].tolist() == [3 * 7, "formula", "vector"]
    assert rows.loc["Max", "flops"] == 3 * 7
    assert rows.loc["Cast", ["flops", "dtype", "bytes"]].tolist() == [3, "float32", 3 * 4 + 3 * 2]
    assert rows.loc["DepthwiseConv2dNative", ["flops", "kind"]].tolist() == [2 * 3 * 3 * 2 * 6 * 6 * 2, "matrix"]
    adam = rows.loc["ResourceApplyAdam"]
    assert adam["flops"] == 12 * 20 and adam["flops_source"] == "formula"
    # the gradient and six scalars are read; var, m and v are each read and written
    assert adam["bytes"] == 20 * 4 + 6 * 4 + 3 * 2 * 20 * 4
    assert rows.loc["Reshape", ["flops", "flops_source", "kind"]].tolist() == [0, "none", ""]


@pytest.mark.slow
def test_unknown_shapes_are_unknown_costs_not_zero():
    import tensorflow as tf

    from profiler.roofline import op_costs

    @tf.function
    def unknown_batch(x, w):
        return tf.matmul(x, w)

    graph = unknown_batch.get_concrete_function(tf.TensorSpec((None, 4)), tf.TensorSpec((4, 2))).graph
    row = pd.DataFrame(op_costs.graph_rows(graph)).set_index("type").loc["MatMul"]
    assert math.isnan(row["flops"]) and math.isnan(row["bytes"]) and row["flops_source"] == ""
    assert row["kind"] == "matrix" and row["input_shapes"] == "?x4;4x2"


# ---------------------------------------------------------------- every entry point writes it


def _meta(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())


@pytest.mark.slow
def test_devprof_run_writes_the_train_steps_convolutions(tmp_path):
    from profiler import cli

    rc = cli.main(
        [
            "run",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--out",
            str(tmp_path),
            "--run-name",
            "r",
            "--quiet",
            "--epochs",
            "1",
            "--limit-images",
            "96",
            "--batch-size",
            "16",
            "--no-sample",
            "--profile-steps",
            "2:4",
            "--limit-test-images",
            "16",
        ]
    )
    assert rc == 0
    path = tmp_path / "r"
    meta = _meta(path)
    assert meta["status"] == "complete" and meta["profiler"]["op_costs_seconds"] > 0
    frame = read_op_costs(path)
    assert frame is not None
    step = frame[frame["function"] == "train_one"]  # models/training.py's step function, one step a call
    assert (step["type"] == "Conv2DBackpropFilter").sum() == 6
    convs = step[step["type"] == "Conv2D"]
    assert sorted(convs["flops"]) == sorted(
        2 * 16 * h * h * cout * 9 * cin
        for h, cin, cout in ((32, 3, 32), (32, 32, 32), (16, 32, 64), (16, 64, 64), (8, 64, 128), (8, 128, 128))
    )
    assert meta["profiler"]["op_costs_ops"] == len(frame)


def _small_loop(tmp_path, name, **options):
    import tensorflow as tf

    import profiler

    weights = tf.Variable(tf.ones((6, 3)))

    @tf.function
    def small_step(x):
        return tf.reduce_sum(tf.matmul(x, weights))

    data = tf.data.Dataset.from_tensor_slices(np.ones((40, 6), "float32")).batch(4)
    with profiler.profile(tmp_path, run_name=name, profile_steps="1:3", sample=False, quiet=True, **options) as session:
        for x in session.iterate(data):
            with session.step():
                float(small_step(x))
    return tmp_path / name


@pytest.mark.slow
def test_profile_writes_op_costs(tmp_path):
    path = _small_loop(tmp_path, "loop")
    frame = read_op_costs(path)
    assert frame is not None
    matmul = frame[(frame["function"] == "small_step") & (frame["type"] == "MatMul")]
    assert matmul["flops"].tolist() == [2 * 4 * 6 * 3] and matmul["bytes"].tolist() == [4 * (24 + 18 + 12)]
    assert "op_costs_seconds" in _meta(path)["profiler"]


@pytest.mark.slow
def test_keras_callback_writes_op_costs(tmp_path):
    import keras

    import profiler

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 16)).astype("float32"), rng.integers(0, 4, size=64).astype("int32")
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = profiler.KerasCallback(
        tmp_path, run_name="fit", profile_steps="1:3", sample=False, quiet=True, batch_size=16
    )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    frame = read_op_costs(tmp_path / "fit")
    assert frame is not None
    matmuls = frame[frame["type"] == "MatMul"]
    # the forward Dense and its kernel's gradient (the input needs none), at batch 16: 2 x 16 x 16 x 4 FLOPs each
    assert (matmuls["flops"] == 2 * 16 * 16 * 4).sum() >= 2
    assert _meta(tmp_path / "fit")["status"] == "complete"


@pytest.mark.slow
def test_a_keras_lstms_time_loop_is_costed_per_time_step(tmp_path):
    import keras

    import profiler
    from analysis import analyze
    from analysis.breakdown.roofline import graph_name

    steps, features, hidden, batch = 5, 3, 8, 4
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12 * batch, steps, features)).astype("float32")
    y = rng.normal(size=(12 * batch, 1)).astype("float32")
    model = keras.Sequential([keras.Input((steps, features)), keras.layers.LSTM(hidden), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    callback = profiler.KerasCallback(
        tmp_path, run_name="lstm", profile_steps="2:8", sample=False, quiet=True, batch_size=batch
    )
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[callback])
    ops = analyze(tmp_path / "lstm").ops
    inner = ops["op"].map(graph_name)
    # the loop's ops, forward and backward, as the trace names them: "<loop>/body/_14/<the body graph's name>"
    loop = ops[ops["op"].str.contains("/body/_") & inner.str.contains("lstm_cell") & ops["type"].str.contains("MatMul")]
    forward = loop[~inner[loop.index].str.contains("gradients")]
    # each time step: the input's and the state's matmuls into the 4 gates, 2 FLOPs per multiply-add
    assert forward["flops_per_step"].sum() == pytest.approx(steps * 2 * batch * 4 * hidden * (features + hidden))
    assert (forward["executions_per_step"] == steps).all()
    backward = loop[inner[loop.index].str.contains("gradients")]
    assert len(backward) >= 2 and backward["flops_per_step"].notna().all()


@pytest.mark.slow
def test_a_failing_collector_leaves_the_run_complete_with_a_warning(tmp_path, monkeypatch):
    from profiler.roofline import op_costs

    def broken(graphs=None):
        raise RuntimeError("graphs went away")

    monkeypatch.setattr(op_costs, "collect", broken)
    path = _small_loop(tmp_path, "broken")
    meta = _meta(path)
    assert meta["status"] == "complete" and meta["profiler"]["trace_complete"]
    assert "op costs were not recorded (RuntimeError: graphs went away)" in meta["profiler"]["warnings"]
    assert not (path / OP_COSTS_CSV).exists() and read_op_costs(path) is None
    assert not [p for p in path.iterdir() if p.name.startswith(".op_costs.")]  # no temporary file left


@pytest.mark.slow
def test_a_recording_keeps_its_own_graphs_not_an_earlier_runs_of_the_same_name():
    import tensorflow as tf

    from profiler.roofline import op_costs

    def make():
        @tf.function
        def train_one(x):
            return tf.matmul(x, x)

        return train_one

    make()(tf.ones((8, 8)))  # an earlier run in the same process (a notebook, a test session)
    before = op_costs.graph_ids()
    make()(tf.ones((4, 4)))  # this run's step function: the same name, other shapes
    frame = op_costs.collect(op_costs.recorded_graphs(before))
    mine = frame[frame["function"] == "train_one"]
    assert list(mine.loc[mine["type"] == "MatMul", "flops"]) == [2 * 4 * 4 * 4]

    @tf.function
    def warmed(x):
        return x * 3.0

    warmed(tf.ones((5,)))  # traced before the recording began, and not again: still the recording's
    frame = op_costs.collect(op_costs.recorded_graphs(op_costs.graph_ids()))
    assert "warmed" in set(frame["function"])
