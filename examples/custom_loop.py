"""Profile your own tf.function training loop with devprof.

    python examples/custom_loop.py --out runs
    devprof analyze runs/custom-loop

A small model on synthetic data; `--input-delay-ms 40` makes every batch 40 ms slower to
produce, and `devprof analyze` then calls the run input-bound.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import profiler


FEATURES = 256


def dataset(batch_size: int, batches: int, input_delay_ms: float):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size * batches, FEATURES)).astype("float32")
    y = rng.integers(0, 4, size=batch_size * batches).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).prefetch(2)
    if input_delay_ms > 0:  # a slow input stage after the prefetch, so no buffer hides it
        def sleep():
            time.sleep(input_delay_ms / 1e3)
            return np.int32(0)

        def slow(xb, yb):
            with tf.control_dependencies([tf.numpy_function(sleep, [], tf.int32, stateful=True)]):
                return tf.identity(xb), tf.identity(yb)

        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        ds = ds.map(slow).with_options(options)
    return ds


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs")
    parser.add_argument("--run-name", default="custom-loop")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--input-delay-ms", type=float, default=0.0)
    parser.add_argument("--profile-steps", default="5:15")
    args = parser.parse_args(argv)

    # Big enough that a step (tens of ms) dwarfs fetching a prefetched batch (about a millisecond
    # when the step's math keeps both cores of a small machine busy).
    model = tf.keras.Sequential([tf.keras.Input(shape=(FEATURES,)), tf.keras.layers.Dense(1024, activation="relu"),
                                 tf.keras.layers.Dense(1024, activation="relu"), tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.Adam()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    data = dataset(args.batch_size, args.batches, args.input_delay_ms)
    with profiler.profile(args.out, run_name=args.run_name, profile_steps=args.profile_steps,
                          config={"model": "mlp", "batch_size": args.batch_size}) as session:
        for _ in range(args.epochs):
            with session.epoch():
                for x, y in session.iterate(data):  # times the wait for each batch
                    with session.step():            # a step marker; times the call
                        loss = float(train_step(x, y))
                    session.log(loss=loss)
    return session.path


if __name__ == "__main__":
    print(main())
