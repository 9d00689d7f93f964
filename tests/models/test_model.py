"""The seed CNN, layer for layer: parameter count, layer sequence, precision, and FLOPs by hand."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from models import cnn  # noqa: E402

pytestmark = pytest.mark.slow  # every test here trains, imports TensorFlow or starts a process


@pytest.fixture(scope="module")
def model():
    return cnn.build_cnn()


@pytest.fixture(scope="module")
def bf16_model():
    return cnn.build_cnn("mixed_bfloat16")


def test_parameter_count_is_the_seeds(model):
    # by hand: conv (3*3*cin + 1) * cout, dense (in + 1) * out
    by_hand = [
        (3 * 3 * 3 + 1) * 32,  # 896
        (3 * 3 * 32 + 1) * 32,  # 9,248
        (3 * 3 * 32 + 1) * 64,  # 18,496
        (3 * 3 * 64 + 1) * 64,  # 36,928
        (3 * 3 * 64 + 1) * 128,  # 73,856
        (3 * 3 * 128 + 1) * 128,  # 147,584
        (8 * 8 * 128 + 1) * 128,  # 1,048,704
        (128 + 1) * 10,  # 1,290
    ]
    assert sum(by_hand) == 1_337_002 == cnn.SEED_PARAMS
    assert model.count_params() == 1_337_002
    assert [layer.count_params() for layer in model.layers if layer.count_params()] == by_hand


def test_layer_sequence_matches_the_seed(model):
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == [
        "Conv2D",
        "Conv2D",
        "MaxPooling2D",
        "Conv2D",
        "Conv2D",
        "MaxPooling2D",
        "Conv2D",
        "Conv2D",
        "Flatten",
        "Dropout",
        "Dense",
        "Dense",
    ]
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [c.filters for c in convs] == [32, 32, 64, 64, 128, 128]
    for c in convs:
        assert tuple(c.kernel_size) == (3, 3) and tuple(c.strides) == (1, 1)
        assert c.padding == "same" and c.activation is keras.activations.linear and c.use_bias
    pools = [layer for layer in model.layers if isinstance(layer, keras.layers.MaxPooling2D)]
    assert [tuple(p.pool_size) for p in pools] == [(2, 2), (2, 2)]
    dropout = model.layers[9]
    assert dropout.rate == pytest.approx(0.3)
    hidden, out = model.layers[10], model.layers[11]
    assert hidden.units == 128 and hidden.activation is keras.activations.relu
    assert out.units == 10 and out.activation is keras.activations.softmax
    shapes = [tuple(layer.output.shape) for layer in model.layers]
    assert shapes == [
        (None, 32, 32, 32),
        (None, 32, 32, 32),
        (None, 16, 16, 32),
        (None, 16, 16, 64),
        (None, 16, 16, 64),
        (None, 8, 8, 64),
        (None, 8, 8, 128),
        (None, 8, 8, 128),
        (None, 8192),
        (None, 8192),
        (None, 128),
        (None, 10),
    ]
    assert tuple(model.input_shape) == (None, 32, 32, 3) and tuple(model.output_shape) == (None, 10)


def test_float32_forward_gives_probabilities(model):
    x = np.random.default_rng(0).uniform(0, 1, (2, 32, 32, 3)).astype(np.float32)
    probs = np.asarray(model(x, training=False))
    assert probs.shape == (2, 10) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_mixed_bfloat16_computes_in_bfloat16_with_float32_softmax(bf16_model):
    convs = [layer for layer in bf16_model.layers if isinstance(layer, keras.layers.Conv2D)]
    for layer in convs + [bf16_model.layers[10]]:
        assert layer.compute_dtype == "bfloat16" and layer.variable_dtype == "float32"
        assert layer.kernel.dtype == "float32"  # master weights stay float32
    last = bf16_model.layers[-1]
    assert last.compute_dtype == "float32" and last.activation is keras.activations.softmax
    x = np.random.default_rng(0).uniform(0, 1, (2, 32, 32, 3)).astype(np.float32)
    dtype = keras.backend.standardize_dtype
    hidden = x
    for layer in bf16_model.layers[:-1]:  # every layer before the softmax computes in bfloat16
        hidden = layer(hidden, training=False)
        assert dtype(hidden.dtype) == "bfloat16", layer.name
    assert dtype(bf16_model.layers[-1](hidden).dtype) == "float32"
    probs = bf16_model(x, training=False)
    assert dtype(probs.dtype) == "float32"
    np.testing.assert_allclose(np.asarray(probs).sum(axis=1), 1.0, rtol=1e-3)
    assert bf16_model.count_params() == 1_337_002


def test_train_flops_per_image_by_hand(model, bf16_model):
    # forward multiply-adds, 2 FLOPs each: conv = H_out * W_out * C_out * 3 * 3 * C_in, dense = in * out
    forward = {
        "conv1 32x32, 3->32": 2 * 32 * 32 * 32 * 3 * 3 * 3,  # 1,769,472
        "conv2 32x32, 32->32": 2 * 32 * 32 * 32 * 3 * 3 * 32,  # 18,874,368
        "conv3 16x16, 32->64": 2 * 16 * 16 * 64 * 3 * 3 * 32,  # 9,437,184
        "conv4 16x16, 64->64": 2 * 16 * 16 * 64 * 3 * 3 * 64,  # 18,874,368
        "conv5 8x8, 64->128": 2 * 8 * 8 * 128 * 3 * 3 * 64,  # 9,437,184
        "conv6 8x8, 128->128": 2 * 8 * 8 * 128 * 3 * 3 * 128,  # 18,874,368
        "dense 8192->128": 2 * 8192 * 128,  # 2,097,152
        "dense 128->10": 2 * 128 * 10,  # 2,560
    }
    assert sum(forward.values()) == 79_366_656
    by_hand = 3 * sum(forward.values())  # forward + backward (2x forward)
    assert by_hand == 238_099_968
    assert cnn.train_flops_per_image(model) == by_hand
    assert cnn.train_flops_per_image(bf16_model) == by_hand  # precision does not change the count


# ---------------------------------------------------------------- learning the synthetic data


def test_synthetic_data_is_learned_over_epochs_but_not_solved():
    """A small run climbs above chance and keeps climbing, but stays well short of 100 %: the
    synthetic classes are faint under noise and a fifth of the labels are random (data that
    is solved in one epoch, val_accuracy 1.0000, looks like a broken loop)."""
    import tensorflow as tf

    from models import data
    from models.training import LoopHooks, TrainConfig, Trainer

    class Record(LoopHooks):
        def __init__(self):
            self.epochs = []

        def on_epoch_end(self, result):
            self.epochs.append(result)

    arrays = data.synthetic(3000, 1000, seed=0)
    hooks = Record()
    trainer = Trainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"),
        cnn.build_cnn,
        arrays,
        TrainConfig(batch_size=32, epochs=2, seed=0),
        hooks,
    )
    trainer.fit()
    first, second = hooks.epochs
    assert 0.2 < second.val_accuracy < 0.95, (first, second)
    assert second.accuracy < 0.95, second
    # Training accuracy climbs from epoch to epoch; validation's may dip at its plateau (about 0.8, where
    # the random labels cap it), and did by 0.024 under a change that only reordered float rounding.
    assert second.accuracy > first.accuracy + 0.05, (first.accuracy, second.accuracy)
    assert second.val_loss < 2.2  # it learned: chance is ln(10) = 2.30


def test_validation_covers_the_validation_images_once_every_epoch():
    """Validation reads one iterator over the repeated validation set (a fresh iterator each epoch
    costs more than the pass): each pass must still be exactly the validation images, partial
    last batch included, so it agrees with a one-off pass over them."""
    import tensorflow as tf

    from models import data
    from models.training import TrainConfig, Trainer

    arrays = data.synthetic(200, 300, seed=1)
    trainer = Trainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"),
        cnn.build_cnn,
        arrays,
        TrainConfig(batch_size=100, epochs=1, seed=0, validation_images=250),
    )
    once = data.eval_dataset(arrays.x_test[:250], arrays.y_test[:250], 100)
    expected = trainer.evaluate(once)
    shifted = trainer.evaluate(data.eval_dataset(arrays.x_test[50:300], arrays.y_test[50:300], 100))
    assert shifted != pytest.approx(expected)  # other images give other figures: the check can fail
    for _ in range(3):  # the repeated iterator's passes stay aligned on the 250 images
        assert trainer.validate() == pytest.approx(expected, rel=1e-6)


def test_fused_adam_makes_the_same_update_as_keras_adam():
    """The training step's one-kernel Adam against Keras's own, on the seed CNN's variables over
    three steps of the same gradients: equal weights and moments. A wrong formula (epsilon inside
    the square root, no bias correction) would differ from the first step."""
    import keras
    import tensorflow as tf

    from models.training import fused_adam

    def state(seed):
        keras.utils.set_random_seed(seed)
        model = cnn.build_cnn("float32")
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
        return model, optimizer

    reference, keras_adam = state(3)
    fused_model, fused_optimizer = state(3)
    apply = fused_adam(tf, fused_optimizer)
    assert apply is not None
    fused_step = tf.function(lambda grads: apply(grads, fused_model.trainable_variables))  # as in the train step
    rng = np.random.default_rng(0)
    for _ in range(3):
        grads = [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in reference.trainable_variables]
        keras_adam.apply_gradients(zip(grads, reference.trainable_variables))
        fused_step(grads)
    assert int(fused_optimizer.iterations.numpy()) == int(keras_adam.iterations.numpy()) == 3
    pairs = list(zip(reference.trainable_variables, fused_model.trainable_variables))
    pairs += list(
        zip(keras_adam._momentums + keras_adam._velocities, fused_optimizer._momentums + fused_optimizer._velocities)
    )
    for expected, got in pairs:
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-7)
    moved = max(
        float(np.max(np.abs(a.numpy() - b.numpy())))
        for a, b in zip(state(3)[0].trainable_variables, fused_model.trainable_variables)
    )
    assert moved > 1e-3  # three steps at lr 1e-3 moved the weights: the comparison is not of untouched ones


def test_fused_adam_declines_what_it_would_not_reproduce():
    import keras
    import tensorflow as tf

    from models.training import fused_adam

    assert fused_adam(tf, keras.optimizers.Adam(amsgrad=True)) is None
    assert fused_adam(tf, keras.optimizers.Adam(clipnorm=1.0)) is None
    assert fused_adam(tf, keras.optimizers.AdamW()) is None
    assert fused_adam(tf, keras.optimizers.SGD()) is None
