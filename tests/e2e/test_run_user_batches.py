"""`devprof run` on batches of other shapes than one tensor and one label: a model of two inputs
(a tuple, a dict), a subclassed model whose layers are built on its first call, and one short
batch where --limit-images is below --batch-size. Real TensorFlow, tiny models, a few steps."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from profiler import cli

QUICK = ["--device", "cpu", "--epochs", "1", "--quiet", "--no-profile", "--no-sample"]

TWO_INPUTS = """
    import numpy as np
    import tensorflow as tf
    import keras

    def _model(inputs, a, b):
        merged = keras.layers.Concatenate()([a, b])
        return keras.Model(inputs, keras.layers.Dense(3)(merged), name="two_inputs")

    def as_tuple():
        a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
        return _model([a, b], a, b)

    def as_dict():
        a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
        return _model({"a": a, "b": b}, a, b)

    def _arrays():
        rng = np.random.default_rng(0)
        return (rng.random((30, 4), dtype=np.float32), rng.random((30, 2), dtype=np.float32),
                rng.integers(0, 3, 30).astype("int32"))

    def tuple_data():
        a, b, y = _arrays()
        return tf.data.Dataset.from_tensor_slices(((a, b), y)).batch(10)

    def dict_data():
        a, b, y = _arrays()
        return tf.data.Dataset.from_tensor_slices(({"a": a, "b": b}, y)).batch(10)
    """


def write_module(folder: Path, source: str) -> Path:
    path = folder / "usermodel.py"
    path.write_text(textwrap.dedent(source))
    return path


def trained(tmp_path: Path, capsys, name: str, *args: str) -> Path:
    code = cli.main(["run", *args, "--out", str(tmp_path / "runs"), "--run-name", name, *QUICK])
    assert code == 0, capsys.readouterr().err
    path = tmp_path / "runs" / name
    assert json.loads((path / "run.json").read_text())["status"] == "complete"
    return path


def assert_counts(path: Path, batches: list[int]) -> None:
    """Every step's images and the epoch's images and rate count examples, not tensors or labels."""
    steps = pd.read_csv(path / "steps.csv")
    assert steps["images"].tolist() == batches
    (epoch,) = json.loads((path / "run.json").read_text())["epochs"]
    assert epoch["images"] == sum(batches)
    assert epoch["images_per_second"] == pytest.approx(sum(batches) / epoch["train_seconds"])


@pytest.mark.slow
@pytest.mark.parametrize("model, data", [("as_tuple", "tuple_data"), ("as_dict", "dict_data")])
def test_a_model_of_two_inputs_trains_on_a_tuple_or_a_dict_of_tensors(tmp_path, capsys, model, data):
    module = write_module(tmp_path, TWO_INPUTS)
    path = trained(tmp_path, capsys, model, "--model", f"{module}:{model}", "--dataset", f"{module}:{data}")
    assert_counts(path, [10, 10, 10])
    meta = json.loads((path / "run.json").read_text())
    assert meta["config"]["batch_size"] == 10
    assert meta["model"] == {"name": "two_inputs", "params": 6 * 3 + 3, "train_flops_per_image": 3 * 2 * 6 * 3}


SUBCLASSED = """
    import numpy as np
    import tensorflow as tf
    import keras

    class Mine(keras.Model):  # its layers make their weights on the model's first call
        def __init__(self):
            super().__init__(name="mine")
            self.hidden = keras.layers.Dense(5, activation="relu")
            self.out = keras.layers.Dense(3)

        def call(self, x):
            return self.out(self.hidden(x))

    def build():
        return Mine()

    def data():
        rng = np.random.default_rng(0)
        x, y = rng.random((20, 4), dtype=np.float32), rng.integers(0, 3, 20).astype("int32")
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(5)
    """


@pytest.mark.slow
def test_a_subclassed_model_is_built_on_one_batch_before_the_optimizer_sees_its_weights(tmp_path, capsys):
    module = write_module(tmp_path, SUBCLASSED)
    # with tune's pipeline settings on the user's own pipeline: the same batches, in the same order
    path = trained(
        tmp_path, capsys, "mine", "--model", f"{module}:build", "--dataset", f"{module}:data",
        "--prefetch", "auto", "--parallel-calls", "auto",
    )  # fmt: skip
    assert_counts(path, [5, 5, 5, 5])
    model = json.loads((path / "run.json").read_text())["model"]
    assert model["name"].startswith("mine") and model["params"] == 4 * 5 + 5 + 5 * 3 + 3


def test_a_window_that_training_stops_before_says_how_far_it_got(tmp_path):
    from profiler.record import tracing

    warnings: list[str] = []
    window = tracing.ProfileWindow(tmp_path, 5, 15, warn=warnings.append)
    for next_step in (0, 1, 2):  # training fails in step 2: the window never starts
        window.maybe_start(next_step)
    window.maybe_stop(0, force=True)
    assert warnings == [
        "warning: profile window 5:15 was never reached: training stopped after 2 steps; no trace was written"
    ]


@pytest.mark.slow
def test_limit_images_below_the_batch_trains_one_short_batch_with_a_notice(tmp_path, capsys):
    module = write_module(
        tmp_path,
        """
        import keras

        def build():
            return keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)], name="small")
        """,
    )
    args = [
        "run",
        "--model",
        f"{module}:build",
        "--limit-images",
        "99",
        "--out",
        str(tmp_path / "runs"),
        "--run-name",
        "short",
        *[a for a in QUICK if a != "--quiet"],
    ]  # the notice is not shown with --quiet
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if line.startswith("notice:")]
    assert notices == [
        "notice: --batch-size 100 is more than the 99 training images: each epoch is one short batch of 99"
    ], err
    path = tmp_path / "runs" / "short"
    assert_counts(path, [99])
    meta = json.loads((path / "run.json").read_text())
    assert meta["status"] == "complete" and meta["config"]["batch_size"] == 100 and meta["steps_per_epoch"] == 1
