"""`profiler.KerasCallback`: devprof's recording for `model.fit`, from Keras' batch and epoch
hooks, through the same session as `profiler.profile()`.

A callback sees when each batch begins and ends, not when its data arrives: Keras fetches the
batch inside its train function, so in steps.csv the input wait is part of `call_ms` and
`input_ms` is 0. The trace still shows it (`devprof analyze` reads the iterator's events).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import sys
import time
from pathlib import Path

import keras

from profiler import api

# Keras' log names that are run.json epoch fields; other numbers go to `metrics`.
_EPOCH_FIELDS = ("loss", "accuracy", "val_loss", "val_accuracy")
# fit()'s CallbackList hooks that run between on_train_begin and on_train_end.
_GUARDED_HOOKS = (
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_begin",
    "on_test_end",
    "on_test_batch_begin",
    "on_test_batch_end",
)


class KerasCallback(keras.callbacks.Callback):
    """`model.fit(..., callbacks=[profiler.KerasCallback("runs", run_name="my-fit")])`.

    Options as `profiler.profile()`; `batch_size`: the examples in one batch (Keras does not
    tell callbacks), for images per second. The run directory is `self.path` once fit starts.
    """

    def __init__(
        self,
        out="runs",
        run_name: str | None = None,
        *,
        profile_steps: str | None = None,
        profile: bool = True,
        sample: bool = True,
        sample_interval: float | None = None,
        profiler_port: int | None = None,
        host_tracer_level: int = 2,
        device_tracer_level: int = 1,
        python_tracer_level: int = 0,
        scalars_every: int = 100,
        batch_size: int | None = None,
        config: dict | None = None,
        quiet: bool = False,
    ):
        super().__init__()
        self._options = dict(
            out=out,
            run_name=run_name,
            profile_steps=profile_steps,
            profile=profile,
            sample=sample,
            sample_interval=sample_interval,
            profiler_port=profiler_port,
            host_tracer_level=host_tracer_level,
            device_tracer_level=device_tracer_level,
            python_tracer_level=python_tracer_level,
            scalars_every=scalars_every,
            quiet=quiet,
        )
        api.profile(**self._options).config.check()  # a wrong option is refused here, not when fit() starts
        self._config = dict(config or {})
        self.batch_size = None if batch_size is None else api.whole_number(batch_size, "batch_size", 1)
        self.session: api.ProfileSession | None = None
        self._path: Path | None = None
        self._original_train_function = None
        self._steps_per_call = 1
        self._val_began: float | None = None
        self._val_seconds = 0.0
        self._guarded_evaluate = False
        self._guarded_hooks: list = []

    @property
    def path(self):
        return self.session.path if self.session is not None else self._path

    # ------------------------------------------------------------ fit

    def on_train_begin(self, logs=None):
        if self.session is not None:  # an earlier fit() stopped where no hook saw it
            self._end(RuntimeError("model.fit() stopped before its end"))
        params = self.params or {}
        config = {
            "program": "keras_fit",
            "epochs": params.get("epochs"),
            "steps_per_epoch": params.get("steps"),
            "batch_size": self.batch_size,
            **self._config,
        }
        self.session = session = api.profile(**self._options, config=config)
        session.__enter__()
        model = self.model
        self._steps_per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        session.meta["model"] = model_facts(model)
        if params.get("steps"):
            session.meta["steps_per_epoch"] = params["steps"]
        session._save()
        # fit() has no try/finally around its loop: an error or Ctrl-C in a step, in validation or
        # in another callback would never reach this one. What fit() calls is wrapped, so the run
        # directory still says how it ended and keeps its trace; at exit, anything left open ends.
        original = self._original_train_function = getattr(model, "train_function", None)
        if original is not None:
            model.train_function = self._guarded(original)
        self._guarded_evaluate = "evaluate" not in vars(model)
        if self._guarded_evaluate:
            model.evaluate = self._guarded(model.evaluate)  # validation: fit() calls self.evaluate
        self._guard_callback_list(sys._getframe(1).f_locals.get("self"))
        atexit.register(self._end_at_exit)
        if self.batch_size is None:
            session.console.warn(
                "warning: KerasCallback has no batch_size: steps.csv and run.json record no "
                "images and no images per second (give KerasCallback(batch_size=...) the "
                "batch size given to fit)"
            )

    def _guarded(self, function):
        def guarded(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except BaseException as exc:
                self._end(exc)
                raise

        return guarded

    def _guard_callback_list(self, callbacks) -> None:
        """The hooks of fit()'s CallbackList (the caller of on_train_begin): an exception in another
        callback ends the run as failed, as one in a step does."""
        if not isinstance(callbacks, keras.callbacks.CallbackList):
            return
        for name in _GUARDED_HOOKS:
            if name not in vars(callbacks) and callable(getattr(callbacks, name, None)):
                setattr(callbacks, name, self._guarded(getattr(callbacks, name)))
                self._guarded_hooks.append((callbacks, name))

    def _end_at_exit(self) -> None:
        """The program ends with the run still open (fit() stopped outside every wrapped call)."""
        if self.session is not None:
            self._end(getattr(sys, "last_value", None) or RuntimeError("the program ended inside model.fit()"))

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
        atexit.unregister(self._end_at_exit)
        if self._original_train_function is not None and self.model is not None:
            self.model.train_function = self._original_train_function
            self._original_train_function = None
        if self._guarded_evaluate and self.model is not None:
            self._guarded_evaluate = False
            with contextlib.suppress(AttributeError):
                del self.model.evaluate  # the class's own again
        while self._guarded_hooks:
            callbacks, name = self._guarded_hooks.pop()
            with contextlib.suppress(AttributeError):
                delattr(callbacks, name)
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
