"""`devprof run --model` with a user's model and data that misbehave: a dataset that never ends,
functions that exit or read devprof's own arguments, shapes that do not fit, a loss that cannot
learn. Real TensorFlow, tiny models, synthetic data."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from cli_checks import one_usage_error
from profiler import cli

QUICK = ["--device", "cpu", "--epochs", "1", "--quiet", "--no-profile", "--no-sample"]


def write_module(folder: Path, source: str) -> Path:
    path = folder / "usermodel.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.mark.slow
def test_a_dataset_that_never_ends_is_read_only_as_far_as_limit_images_needs(tmp_path, capsys):
    module = write_module(
        tmp_path,
        """
        import numpy as np
        import tensorflow as tf

        READ_LIMIT = 200  # batches in one pass; the run needs 20 (and a few prefetched)

        def build():
            return tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(3)])

        def endless():
            def batches():
                read = 0
                while True:  # never ends: its cardinality is unknown
                    read += 1
                    if read > READ_LIMIT:
                        raise RuntimeError("read past what --limit-images needs")
                    yield np.zeros((10, 8), "float32"), np.zeros((10,), "int32")
            spec = (tf.TensorSpec((10, 8), tf.float32), tf.TensorSpec((10,), tf.int32))
            return tf.data.Dataset.from_generator(batches, output_signature=spec)
        """,
    )
    code = cli.main(
        [
            "run",
            "--model",
            f"{module}:build",
            "--dataset",
            f"{module}:endless",
            "--limit-images",
            "200",
            "--out",
            str(tmp_path / "runs"),
            "--run-name",
            "endless",
            *QUICK,
        ]
    )
    assert code == 0, capsys.readouterr().err
    path = tmp_path / "runs" / "endless"
    assert json.loads((path / "run.json").read_text())["status"] == "complete"
    steps = pd.read_csv(path / "steps.csv")
    assert len(steps) == 20 and steps["images"].sum() == 200


USER_CODE = """
    import numpy as np
    import tensorflow as tf

    def build():
        return tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(3, name="dense")])

    def exits():
        raise SystemExit(0)

    def five_features():
        x, y = np.zeros((40, 5), "float32"), np.zeros((40,), "int32")
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(10)

    def two_inputs():
        a, b, y = np.ones((40, 8), "float32"), np.ones((40, 4), "float32"), np.zeros((40,), "int32")
        return tf.data.Dataset.from_tensor_slices(((a, b), y)).batch(10)
    """


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, dataset, expected",
    [
        ("exits", None, "error: --model {module}:exits: calling it exited (SystemExit: 0) instead of returning"),
        (
            "build",
            "five_features",
            "error: --model {module}:build: a batch does not fit the model and loss (ValueError: "
            "Input 0 with name 'None' of layer 'dense' is incompatible with the layer: expected axis "
            "-1 of input shape to have value 8, but received input with shape (10, 5); batch x "
            "(10, 5), y (10,); model input (None, 8), output (None, 3))",
        ),
        # one line with the shapes, no Keras warning and no batch values first
        (
            "build",
            "two_inputs",
            "error: --model {module}:build: a batch has 2 inputs (x ((10, 8), (10, 4))) and the "
            "model takes 1; model input (None, 8), output (None, 3)",
        ),
    ],
)
def test_a_model_function_that_exits_or_does_not_fit_is_one_usage_error(tmp_path, capsys, model, dataset, expected):
    module = write_module(tmp_path, USER_CODE)
    data = ["--dataset", f"{module}:{dataset}"] if dataset else []
    code = cli.main(
        ["run", "--model", f"{module}:{model}", *data, "--limit-images", "40", "--out", str(tmp_path / "runs"), *QUICK]
    )
    assert one_usage_error(code, capsys) == expected.format(module=module)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_module_that_parses_arguments_at_import_and_a_one_unit_output(tmp_path, capsys):
    """The module's parser sees no arguments (not devprof's); the one-unit output that the default
    loss cannot train is warned about once, before training."""
    module = write_module(
        tmp_path,
        """
        import argparse

        import tensorflow as tf

        # A training script's own options, parsed at import (it is also run on its own).
        parser = argparse.ArgumentParser()
        parser.add_argument("--units", type=int, default=1)
        ARGS = parser.parse_args()

        def one_unit():
            return tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(ARGS.units)],
                                       name="one_unit")
        """,
    )
    code = cli.main(
        [
            "run",
            "--model",
            f"{module}:one_unit",
            "--limit-images",
            "40",
            "--batch-size",
            "10",
            "--out",
            str(tmp_path / "runs"),
            "--run-name",
            "one-unit",
            *QUICK,
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: model 'one_unit' has one output unit: the default loss, sparse categorical "
        "cross-entropy, sees one class and is always 0, so nothing is learned; give --loss "
        "binary_crossentropy for a yes/no label (a sigmoid last layer), --loss mean_squared_error "
        "for a number, or one unit per class"
    ], err
    assert json.loads((tmp_path / "runs" / "one-unit" / "run.json").read_text())["status"] == "complete"
