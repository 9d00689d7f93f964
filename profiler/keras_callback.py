"""`profiler.KerasCallback`: devprof's recording for `model.fit`, from Keras' batch and epoch
hooks, through the same session as `profiler.profile()`.

A callback sees when each batch begins and ends, not when its data arrives: Keras fetches the
batch inside its train function, so in steps.csv the input wait is part of `call_ms` and
`input_ms` is 0. The trace still shows it (`devprof analyze` reads the iterator's events).
"""

from __future__ import annotations

import math
import time

import keras

from profiler import api

# Keras' log names that are run.json epoch fields; other numbers go to `metrics`.
_EPOCH_FIELDS = ("loss", "accuracy", "val_loss", "val_accuracy")


class KerasCallback(keras.callbacks.Callback):
    """`model.fit(..., callbacks=[profiler.KerasCallback("runs", run_name="my-fit")])`.

    Options as `profiler.profile()`; `batch_size`: the examples in one batch (Keras does not
    tell callbacks), for images per second. The run directory is `self.path` once fit starts.
    """

    def __init__(self, out="runs", run_name: str | None = None, *, profile_steps: str | None = None,
                 profile: bool = True, sample: bool = True, sample_interval: float = 0.5,
                 profiler_port: int | None = None, host_tracer_level: int = 2, device_tracer_level: int = 1,
                 python_tracer_level: int = 0, scalars_every: int = 100, batch_size: int | None = None,
                 config: dict | None = None, quiet: bool = False):
        super().__init__()
        self._options = dict(out=out, run_name=run_name, profile_steps=profile_steps, profile=profile,
                             sample=sample, sample_interval=sample_interval, profiler_port=profiler_port,
                             host_tracer_level=host_tracer_level, device_tracer_level=device_tracer_level,
                             python_tracer_level=python_tracer_level, scalars_every=scalars_every, quiet=quiet)
        self._config = dict(config or {})
        self.batch_size = batch_size
        self.session: api.ProfileSession | None = None
        self._path = None
        self._original_train_function = None
        self._steps_per_call = 1
        self._val_began: float | None = None
        self._val_seconds = 0.0

    @property
    def path(self):
        return self.session.path if self.session is not None else self._path

    # ------------------------------------------------------------ fit

    def on_train_begin(self, logs=None):
        params = self.params or {}
        config = {"program": "keras_fit", "epochs": params.get("epochs"), "steps_per_epoch": params.get("steps"),
                  "batch_size": self.batch_size, **self._config}
        self.session = session = api.profile(**self._options, config=config)
        session.__enter__()
        model = self.model
        self._steps_per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        session.meta["model"] = model_facts(model)
        if params.get("steps"):
            session.meta["steps_per_epoch"] = params["steps"]
        session._save()
        # fit() has no try/finally around its loop: an error or Ctrl-C in a step would never reach
        # a callback. The train function is wrapped so the run directory still says how it ended.
        original = self._original_train_function = getattr(model, "train_function", None)
        if original is not None:
            def guarded(*args, **kwargs):
                try:
                    return original(*args, **kwargs)
                except BaseException as exc:
                    self._end(exc)
                    raise
            model.train_function = guarded

    def on_epoch_begin(self, epoch, logs=None):
        if self.session is not None:
            self._val_seconds = 0.0
            self.session.begin_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        if self.session is not None:
            self.session._begin_step(time.perf_counter(), self._steps_per_call)

    def on_train_batch_end(self, batch, logs=None):
        session = self.session
        if session is None or session._boundary is None:
            return
        done = time.perf_counter()
        images = self.batch_size * self._steps_per_call if self.batch_size else 0
        session._step_ran(images, self._steps_per_call, session._boundary, done)
        numbers = _numbers(logs)
        if numbers:
            session.log(**numbers)

    def on_test_begin(self, logs=None):
        self._val_began = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._val_began is not None:
            self._val_seconds += time.perf_counter() - self._val_began
            self._val_began = None

    def on_epoch_end(self, epoch, logs=None):
        if self.session is None:
            return
        numbers = _numbers(logs)
        extra = {"validation_seconds": self._val_seconds}
        others = {k: v for k, v in numbers.items() if k not in _EPOCH_FIELDS}
        self.session._epoch_values = {}  # the epoch's own logs, not the last batch's
        self.session.end_epoch({k: v for k, v in numbers.items() if k in _EPOCH_FIELDS}, extra)
        if others:
            self.session.meta["epochs"][-1]["metrics"] = others
            self.session._save()

    def on_train_end(self, logs=None):
        self._end(None)

    def _end(self, exc):
        session, self.session = self.session, None
        if self._original_train_function is not None and self.model is not None:
            self.model.train_function = self._original_train_function
            self._original_train_function = None
        if session is not None:
            self._path = session.path
            session.__exit__(type(exc) if exc is not None else None, exc, None)


def _numbers(logs) -> dict:
    found = {}
    for name, value in (logs or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            found[name] = number
    return found


def model_facts(model) -> dict:
    """run.json `model`: name, parameter count and, where the layers allow, training FLOPs per example."""
    from models.user_model import train_flops_per_example

    try:
        params = int(model.count_params())
    except Exception:  # noqa: BLE001 - a model not built yet
        params = None
    return {"name": model.name, "params": params, "train_flops_per_image": train_flops_per_example(model)}
