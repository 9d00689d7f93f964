"""The seed program's CIFAR-10 CNN, layer for layer."""

from __future__ import annotations

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
SEED_PARAMS = 1_337_002


def build_cnn(precision: str = "float32"):
    """Build the seed CNN (6 Conv2D without activation, as in the seed, then Dense 128, Dense 10).

    `precision` is a Keras dtype policy name; the softmax stays float32 so the loss is stable
    under mixed precision.
    """
    import keras

    policy = keras.mixed_precision.DTypePolicy(precision)

    def conv(filters, **kwargs):
        return keras.layers.Conv2D(filters, 3, strides=1, padding="same", dtype=policy, **kwargs)

    def pool():
        return keras.layers.MaxPool2D(pool_size=2, strides=2, padding="same", dtype=policy)

    return keras.Sequential(
        [
            keras.Input(shape=IMAGE_SHAPE),
            conv(32),
            conv(32),
            pool(),
            conv(64),
            conv(64),
            pool(),
            conv(128),
            conv(128),
            keras.layers.Flatten(dtype=policy),
            keras.layers.Dropout(0.3, dtype=policy),
            keras.layers.Dense(128, activation="relu", dtype=policy),
            keras.layers.Dense(NUM_CLASSES, activation="softmax", dtype="float32"),
        ],
        name="seed_cifar10_cnn",
    )


def train_flops_per_image(model) -> int:
    """Multiply-add FLOPs of one training image: forward + backward (2x forward) from the layers.

    Counts Conv2D and Dense (2 FLOPs per multiply-add); pooling, bias and activations are
    negligible at this size and left out, as MLPerf-style MFU accounting does.
    """
    import keras

    forward = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw = layer.kernel_size
            cin = layer.input.shape[-1]
            _, h, w, cout = layer.output.shape
            forward += 2 * h * w * cout * kh * kw * cin
        elif isinstance(layer, keras.layers.Dense):
            forward += 2 * layer.input.shape[-1] * layer.units
    return 3 * forward
