"""Profile `model.fit` with devprof's Keras callback.

    python examples/keras_fit.py --out runs
    devprof analyze runs/keras-fit

A small model on synthetic data, two epochs with validation.
"""

import argparse

import numpy as np
import tensorflow as tf

import profiler


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs")
    parser.add_argument("--run-name", default="keras-fit")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--profile-steps", default="3:13")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 64)).astype("float32")
    y = rng.integers(0, 4, size=640).astype("int32")
    model = tf.keras.Sequential([tf.keras.Input(shape=(64,)), tf.keras.layers.Dense(128, activation="relu"),
                                 tf.keras.layers.Dense(4, activation="softmax")], name="keras_fit_example")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    callback = profiler.KerasCallback(args.out, run_name=args.run_name, profile_steps=args.profile_steps,
                                      batch_size=args.batch_size)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, validation_split=0.2, verbose=0,
              callbacks=[callback])
    return callback.path


if __name__ == "__main__":
    print(main())
