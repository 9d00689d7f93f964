"""The CNN's pipeline settings (`--prefetch`, `--parallel-calls`): what they accept, and that they act on
every stage, the injected input delay's included."""

from __future__ import annotations

import time

import numpy as np
import pytest

from profiler.cli.commands import run as run_command
from profiler.train.config import UsageError


@pytest.mark.parametrize("text, value", [("1", 1), ("16", 16), ("auto", -1), (" AUTO ", -1)])
def test_batches_are_whole_numbers_from_one_or_auto(text, value):
    assert run_command.batches(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "2.5", "", "many"])
def test_anything_else_is_refused_with_what_is_wanted(text):
    with pytest.raises(Exception, match="whole number of batches from 1, or auto"):
        run_command.batches(text)


def test_the_settings_are_the_cnns_own_pipelines(tmp_path):
    import argparse

    from profiler.cli.commands.run import build_config

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    run_command.add_parser(sub)
    args = parser.parse_args(["run", "--model", "m:f", "--prefetch", "2", "--out", str(tmp_path)])
    config = build_config(args)
    assert config.train.prefetch == 2 and config.train.parallel_calls is None
    with pytest.raises(UsageError, match="--prefetch sets the CNN's own pipeline, or your --dataset's"):
        config.validate()
    with_dataset = ["run", "--model", "m:f", "--dataset", "m:d", "--out", str(tmp_path)]
    build_config(parser.parse_args([*with_dataset, "--prefetch", "auto", "--parallel-calls", "auto"])).validate()
    with pytest.raises(UsageError, match="--parallel-calls 4: with --dataset only auto"):
        build_config(parser.parse_args([*with_dataset, "--parallel-calls", "4"])).validate()


def _seconds_per_batch(dataset, batches: int) -> float:
    iterator = iter(dataset)
    next(iterator)  # the pipeline's start-up
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - start) / batches


@pytest.mark.slow  # imports TensorFlow
def test_parallel_calls_run_the_injected_delay_on_several_batches_at_once():
    from models import data

    x = np.zeros((64 * 32, 32, 32, 3), dtype=np.uint8)
    y = np.zeros(64 * 32, dtype=np.int64)
    # The control is the seed's pipeline in the same conditions: a sleep waits however busy the machine is.
    seed = _seconds_per_batch(data.train_dataset(x, y, 32, input_delay_ms=30.0), 20)
    parallel = _seconds_per_batch(data.train_dataset(x, y, 32, input_delay_ms=30.0, parallel_calls=4, prefetch=4), 20)
    assert seed >= 0.029  # one batch at a time: the whole delay each
    assert parallel <= 0.65 * seed, (parallel, seed)  # 4 at once: 0.25 when quiet, 0.51 seen under load


@pytest.mark.slow  # imports TensorFlow
def test_a_users_slow_stateless_map_is_parallelized_and_prefetched():
    import tensorflow as tf

    from models import data

    def slow(x):
        time.sleep(0.03)  # a read or a decode: waits however busy the machine is
        return x

    def users_pipeline():  # one batch at a time, nothing prefetched: tf.data's own parallelizing turned off
        images = tf.data.Dataset.from_tensor_slices(np.zeros((64 * 32, 8), dtype=np.float32)).batch(32)
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        return images.map(lambda x: tf.numpy_function(slow, [x], tf.float32, stateful=False)).with_options(options)

    seed = _seconds_per_batch(users_pipeline(), 20)
    tuned = _seconds_per_batch(data.tuned_dataset(users_pipeline(), prefetch=-1, parallel_calls=-1), 20)
    assert seed >= 0.029
    assert tuned <= 0.7 * seed, (tuned, seed)
