"""A user's own Keras model (and data) for devprof's training loop: `MODULE:FUNCTION` loading,
the loss, synthetic data shaped from the model, and training FLOPs from its layers."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import re
import sys
from pathlib import Path

import numpy as np


class ModelError(Exception):
    """A model or dataset function that cannot be used (a usage error)."""


@contextlib.contextmanager
def _as_its_own_program(name: str):
    """While the user's code runs, `sys.argv` is what it would be were the file run on its own
    with no arguments: a module that parses arguments at import must not read devprof's."""
    saved = sys.argv
    sys.argv = [name]
    try:
        yield
    finally:
        sys.argv = saved


def load_function(spec: str, option: str):
    """`MODULE:FUNCTION` (importable from the current folder) or `FILE.py:FUNCTION`."""
    target, sep, name = str(spec).rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ModelError(f"{option} wants MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target)
        if path.is_dir():
            raise ModelError(f"{option} {spec}: {path} is a folder, not a Python file")
        if not path.is_file():
            raise ModelError(f"{option} {spec}: no file {path}")
        module_name = f"devprof_user_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:  # a name Python does not load as source
            raise ModelError(f"{option} {spec}: {path} is not a Python file")
        loader = module_spec.loader
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            with _as_its_own_program(str(path)):
                loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: one line says what failed
            sys.modules.pop(module_name, None)
            raise ModelError(f"{option} {spec}: importing {path} failed: {_one_line(exc)}") from None
    else:
        if Path(target).is_file():  # `notes.txt:build` reads as the module `notes`, then its submodule `txt`
            raise ModelError(
                f"{option} {spec}: {target} is not a Python file (.py): give FILE.py:FUNCTION or MODULE:FUNCTION"
            )
        added = os.getcwd() not in sys.path
        if added:
            sys.path.insert(0, os.getcwd())
        try:
            with _as_its_own_program(target):
                module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name and target.split(".")[0] == exc.name.split(".")[0]:
                raise ModelError(
                    f"{option} {spec}: no module named {exc.name!r} here ({os.getcwd()}); run from "
                    "the folder that holds it, or give FILE.py:FUNCTION"
                ) from None
            raise ModelError(f"{option} {spec}: importing {target} failed: {_one_line(exc)}") from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise ModelError(f"{option} {spec}: importing {target} failed: {_one_line(exc)}") from None
        finally:
            if added:
                with_cwd = os.getcwd()
                if with_cwd in sys.path:
                    sys.path.remove(with_cwd)
    function = getattr(module, name, None)
    if function is None:
        raise ModelError(f"{option} {spec}: {target} has no {name!r}")
    if not callable(function):
        raise ModelError(f"{option} {spec}: {name!r} is a {type(function).__name__}, not a function")
    return function


def build_model(function, spec: str, precision: str = "float32"):
    """Call the user's function under the dtype policy; it must return a Keras model."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    try:
        model = call_user(function, "--model", spec)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    if not isinstance(model, keras.Model):
        raise ModelError(f"--model {spec} returned {type(model).__name__}, not a Keras model")
    return model


def call_user(function, option: str, spec: str):
    """`function()`, the user's: a failure, or an exit (`sys.exit`), is a ModelError in one line."""
    try:
        with _as_its_own_program(spec.rpartition(":")[0] or spec):
            return function()
    except SystemExit as exc:
        raise ModelError(f"{option} {spec}: calling it exited ({_one_line(exc)}) instead of returning") from None
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"{option} {spec}: calling it failed: {_one_line(exc)}") from None


def one_class_warning(model, loss_name: str | None) -> str | None:
    """Why the default loss cannot train this model, or None: sparse categorical cross-entropy
    over a single output unit is one class, whose probability is always 1 (loss 0)."""
    if loss_name not in (None, "sparse_categorical_crossentropy"):
        return None
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1:
        return None
    shape = tuple(outputs[0].shape[1:])
    if shape and shape[-1] != 1:
        return None
    return (
        f"model {model.name!r} has one output unit: the default loss, sparse categorical cross-entropy, "
        "sees one class and is always 0, so nothing is learned; give --loss binary_crossentropy for a "
        "yes/no label (a sigmoid last layer), --loss mean_squared_error for a number, or one unit per class"
    )


def ends_in_softmax(model) -> bool:
    """Whether the model's last layer outputs probabilities (else the loss takes logits)."""
    import keras

    layer = model.layers[-1] if getattr(model, "layers", None) else None
    if layer is None:
        return False
    if isinstance(layer, keras.layers.Softmax):
        return True
    activation = getattr(layer, "activation", None)
    return getattr(activation, "__name__", "") == "softmax"


def make_loss(name: str | None, model):
    """(per-example loss, is classification): sparse categorical cross-entropy by default
    (`from_logits` when the last layer has no softmax), else the Keras loss `name`."""
    import keras

    if name in (None, "sparse_categorical_crossentropy"):
        logits = not ends_in_softmax(model)
        return keras.losses.SparseCategoricalCrossentropy(from_logits=logits, reduction="none"), True
    try:
        loss = keras.losses.get(name)
    except (ValueError, TypeError):
        loss = None
    if loss is None:
        raise ModelError(
            f"--loss {name!r} is not a Keras loss name (e.g. mean_squared_error, "
            "categorical_crossentropy, binary_crossentropy)"
        )
    if isinstance(loss, keras.losses.Loss):  # a class: per-example values, reduced by the loop
        loss = type(loss)(reduction="none")
    return loss, False


def shapes(model) -> tuple[tuple, tuple]:
    """The model's one input shape and one output shape, without the batch dimension."""
    inputs = getattr(model, "inputs", None)
    outputs = getattr(model, "outputs", None)
    if not inputs or not outputs:
        raise ModelError(
            f"model {model.name!r} has no known input shape (a subclassed model not called yet): "
            "start it with keras.Input(shape=...), or give --dataset MODULE:FUNCTION"
        )
    if len(inputs) != 1 or len(outputs) != 1:
        raise ModelError(
            f"model {model.name!r} has {len(inputs)} inputs and {len(outputs)} outputs; synthetic "
            "data fits one of each: give --dataset MODULE:FUNCTION"
        )
    in_shape, out_shape = tuple(inputs[0].shape[1:]), tuple(outputs[0].shape[1:])
    if any(d is None for d in in_shape + out_shape):
        raise ModelError(
            f"model {model.name!r} has an input or output dimension of unknown size "
            f"(input {in_shape}, output {out_shape}); synthetic data needs fixed sizes: "
            "give --dataset MODULE:FUNCTION"
        )
    return in_shape, out_shape


def synthetic_arrays(model, classification: bool, train_images: int, test_images: int, seed: int = 0):
    """Random examples shaped like the model's input (uint8, scaled to [0, 1] by the pipeline)
    and labels like its output: class numbers for classification, else numbers in [0, 1]."""
    from models.data import Arrays

    in_shape, out_shape = shapes(model)
    rng = np.random.default_rng(seed)

    def make(count):
        x = rng.integers(0, 256, size=(count, *in_shape), dtype=np.uint8)
        if classification:
            y = rng.integers(0, max(out_shape[-1] if out_shape else 1, 1), size=(count, *out_shape[:-1])).astype(
                np.int32
            )
        else:
            y = rng.random(size=(count, *out_shape)).astype(np.float32)
        return x, y

    x_train, y_train = make(train_images)
    x_test, y_test = make(test_images)
    return Arrays(x_train, y_train, x_test, y_test, source="synthetic")


def default_images(model, batch_size: int, budget_bytes: int = 256 << 20) -> int:
    """How many synthetic training examples: up to 50,000, within `budget_bytes` of memory."""
    in_shape, _ = shapes(model)
    per_example = max(1, math.prod(in_shape))
    return int(max(batch_size, min(50_000, budget_bytes // per_example)))


def train_flops_per_example(model) -> int | None:
    """Training FLOPs of one example (forward + backward = 3x forward, 2 per multiply-add) from
    Dense and convolution layers; None when a layer with weights is of a kind not counted
    (its FLOPs would be missing, and MFU wrong)."""
    import keras

    negligible = (keras.layers.BatchNormalization, keras.layers.LayerNormalization, keras.layers.Embedding)
    convs = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)
    forward = 0
    try:
        for layer in _leaf_layers(model):
            if isinstance(layer, convs) and not isinstance(
                layer, (keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose, keras.layers.Conv3DTranspose)
            ):
                cin = layer.input.shape[-1] // max(getattr(layer, "groups", 1), 1)
                out = layer.output.shape
                forward += 2 * math.prod(out[1:]) * math.prod(layer.kernel_size) * cin
            elif isinstance(layer, keras.layers.Dense):
                shape = layer.input.shape
                forward += 2 * math.prod(shape[1:-1]) * shape[-1] * layer.units
            elif layer.weights and not isinstance(layer, negligible):
                return None
    except Exception:  # noqa: BLE001 - a layer without known shapes: not computable
        return None
    return int(3 * forward)


def _leaf_layers(model):
    for layer in model.layers:
        if getattr(layer, "layers", None):
            yield from _leaf_layers(layer)
        else:
            yield layer


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Keras wraps a layer's error between these lines; the line that says what is wrong is inside.
_KERAS_WRAPPING = ("Exception encountered when calling", "Arguments received by", "•")


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(_KERAS_WRAPPING)]
    text = (said or lines or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
