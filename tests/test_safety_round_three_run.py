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
    module = write_module(tmp_path, """
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
        """)
    code = cli.main(["run", "--model", f"{module}:build", "--dataset", f"{module}:endless", "--limit-images", "200",
                     "--out", str(tmp_path / "runs"), "--run-name", "endless", *QUICK])
    assert code == 0, capsys.readouterr().err
    path = tmp_path / "runs" / "endless"
    assert json.loads((path / "run.json").read_text())["status"] == "complete"
    steps = pd.read_csv(path / "steps.csv")
    assert len(steps) == 20 and steps["images"].sum() == 200
