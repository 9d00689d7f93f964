"""One profiled training run: resolve the device, load data, train under the hooks, and keep
the run directory complete and readable whatever happens."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.device import quiet
from profiler.record import rundir, tracing
from profiler.record.console import Console
from profiler.record.session import Session, Terminated, tpu_monitor_address, versions  # noqa: F401 - re-exported
from profiler.train.config import RunConfig, UsageError
from profiler.train.hooks import RunHooks

if TYPE_CHECKING:
    from models.training import Trainer
    from profiler.train.onednn_verbose import Diversion


class Run(Session):
    """`devprof run`: devprof's own training loop as one client of the recording session;
    `execute()` drives it."""

    def __init__(self, config: RunConfig, console: Console | None = None, backend=None):
        super().__init__(config, console or Console(config.quiet))
        self.backend = backend
        self.trainer: Trainer | None = None
        self.user_model: dict[str, Any] | None = None  # --model: the user's model function, loss and data
        self.onednn: Diversion | None = None  # --onednn-kernels: oneDNN's lines taken off stdout

    def current_step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    def _new_job_meta(self, addresses, job_id) -> dict:
        from profiler.record import job

        return job.new_meta(self.config, addresses, job_id)

    # ------------------------------------------------------------ set-up (no run directory yet)

    def prepare(self):
        """Everything that can fail because of the user's input, before anything is written."""
        from models import data as data_mod
        from profiler.device import devices

        cfg = self.config
        cfg.validate()
        try:
            rundir.check_output_folder(Path(cfg.out))
        except rundir.OutputError as exc:
            raise UsageError(str(exc)) from None
        cluster = cfg.cluster
        self._check_destinations()
        if cfg.profiler_port is not None:
            try:
                tracing.check_port_free(cfg.profiler_port)
            except OSError as exc:
                raise UsageError(
                    f"--profiler-port {cfg.profiler_port} is not free ({exc.strerror or exc}); choose another port"
                ) from None
        try:
            resolved = devices.resolve(
                cfg.device,
                cfg.gpus,
                cfg.tpu,
                backend=self.backend,
                cluster=cluster,
                collective_timeout_s=cfg.collective_timeout_s,
            )
        except devices.DeviceError as exc:
            raise UsageError(str(exc)) from None
        try:
            if cfg.model is not None:
                arrays = self._prepare_user_model()
            else:
                arrays = data_mod.load(
                    cfg.data,
                    cfg.data_dir,
                    cfg.limit_images,
                    cfg.train.seed,
                    notice=self.console.notice,
                    limit_test_images=cfg.limit_test_images,
                )
        except data_mod.DataError as exc:
            raise UsageError(str(exc)) from None
        if arrays is not None and cfg.train.batch_size > len(arrays.x_train):
            self._short_batch(len(arrays.x_train), example_bytes(arrays.x_train))
        if cluster is not None:
            self.path = self.job_dir / cluster.name
        else:
            if cfg.run_name:
                self.path = Path(cfg.out) / cfg.run_name
            else:
                self.default_name = rundir.default_run_name(resolved.kind, devices.host_name())
                self.path = rundir.free_run_dir(Path(cfg.out), self.default_name)
        rundir.check_new(self.path)
        slow = devices.precision_warning(
            cfg.train.precision, resolved.kind, devices.cpu_flags() if resolved.kind == "cpu" else None
        )
        if slow:
            self.console.warn(f"warning: {slow}")
        return resolved, arrays

    def _short_batch(self, images: int, per_example: int) -> None:
        """A batch beyond the training images: each epoch is one short batch of all of them, as Keras
        and tf.data run it, with a notice. Refused where it cannot run: several workers train on full
        batches only, and a batch that size could not be allocated here (a mistyped size)."""
        cfg = self.config
        batch = cfg.train.batch_size
        why = (
            "several workers train on full batches only"
            if cfg.cluster is not None
            else batch_memory_problem(batch, per_example)
        )
        if why:
            raise UsageError(
                f"--batch-size {batch:,} is more than the {images:,} training images, and {why} "
                f"(use --batch-size {images} or fewer"
                f"{', or a larger --limit-images' if cfg.limit_images is not None else ''})"
            )
        self.console.notice(
            f"notice: --batch-size {batch:,} is more than the {images:,} training images: each "
            f"epoch is one short batch of {images:,}"
        )

    def _prepare_user_model(self):
        """--model (and --dataset, --loss): load the user's functions, build the model once to
        check it, shape the data, and try one batch, so that bad input is a usage error before
        anything is written. Returns the arrays (None with --dataset)."""
        from models import data as data_mod
        from models import user_model as um

        cfg = self.config
        try:
            function = um.load_function(cfg.model, "--model")
            model = um.build_model(function, cfg.model, cfg.train.precision)
            loss, classification = um.make_loss(cfg.loss, model)
            cannot_learn = um.one_class_warning(model, cfg.loss)
            if cannot_learn:
                self.console.warn(f"warning: {cannot_learn}")
            dataset, steps, arrays = None, None, None
            if cfg.dataset is not None:
                dataset, steps, batch = self._user_dataset(um.load_function(cfg.dataset, "--dataset"))
                x, y = batch
            else:
                if cfg.data == "cifar10":
                    arrays = data_mod.load(
                        "cifar10",
                        cfg.data_dir,
                        cfg.limit_images,
                        cfg.train.seed,
                        notice=self.console.notice,
                        limit_test_images=cfg.limit_test_images,
                    )
                else:
                    too_big = batch_memory_problem(cfg.train.batch_size, 4 * math.prod(um.shapes(model)[0]))
                    if too_big and not cfg.limit_images:  # before making a full batch of synthetic examples
                        raise UsageError(f"--batch-size {cfg.train.batch_size:,}: {too_big}")
                    train = cfg.limit_images or um.default_images(model, cfg.train.batch_size)
                    test = cfg.limit_test_images or max(1, min(cfg.train.validation_images, train // 5))
                    arrays = um.synthetic_arrays(model, classification, train, test, cfg.train.seed)
                x, y = arrays.x_train[:2].astype("float32") / 255.0, arrays.y_train[:2]
            _check_inputs(cfg.model, model, x)
            try:
                with warnings.catch_warnings():  # Keras' own multi-line warning says what the one line below says
                    warnings.simplefilter("ignore")
                    loss(y, model(x, training=False))
            except Exception as exc:  # noqa: BLE001 - the user's shapes: one line says which
                raise um.ModelError(
                    f"--model {cfg.model}: a batch does not fit the model and loss "
                    f"({um._one_line(exc)}; batch x {_shape(x)}, y {_shape(y)}"
                    f"{_model_shapes(model)})"
                ) from None
        except um.ModelError as exc:
            raise UsageError(str(exc)) from None
        self.user_model = {
            "function": function,
            "loss": loss,
            "classification": classification,
            "dataset": dataset,
            "steps_per_epoch": steps,
            "flops": um.train_flops_per_example(model),
        }
        return arrays

    def _user_dataset(self, function):
        """The user's `tf.data` dataset of (x, y) batches: its steps per epoch and a first batch."""
        import tensorflow as tf

        from models import user_model as um

        cfg = self.config
        spec = cfg.dataset
        dataset = um.call_user(function, "--dataset", spec)
        if not isinstance(dataset, tf.data.Dataset):
            raise um.ModelError(f"--dataset {spec} returned {type(dataset).__name__}, not a tf.data.Dataset")
        try:
            batch = next(iter(dataset.take(1)))
        except StopIteration:
            raise um.ModelError(f"--dataset {spec} is empty") from None
        except Exception as exc:  # noqa: BLE001
            raise um.ModelError(f"--dataset {spec}: reading a batch failed: {um._one_line(exc)}") from None
        if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not tf.nest.flatten(batch[0]):
            raise um.ModelError(f"--dataset {spec} must give (x, y) batches")
        size = tf.nest.flatten(batch[0])[0].shape[0]  # x may be a tuple or dict of tensors: its first one
        if size:
            self.config.train = dataclasses.replace(cfg.train, batch_size=int(size))
        limit = max(1, -(-cfg.limit_images // cfg.train.batch_size)) if cfg.limit_images else None
        cardinality = int(dataset.cardinality())
        if cardinality == tf.data.INFINITE_CARDINALITY:
            if not limit:
                raise um.ModelError(f"--dataset {spec} never ends: give --limit-images N, the examples of one epoch")
            steps = limit
        elif cardinality == tf.data.UNKNOWN_CARDINALITY:
            # Its length is known only by reading it (a generator may never end): no further than
            # the limit needs.
            if not limit:
                self.console.notice(
                    f"notice: --dataset {spec} does not say how many batches it has; reading it "
                    "once to count them (--limit-images N reads only what N needs)"
                )
            try:
                steps = sum(1 for _ in (dataset.take(limit) if limit else dataset))
            except Exception as exc:  # noqa: BLE001 - the user's pipeline
                raise um.ModelError(f"--dataset {spec}: reading its batches failed: {um._one_line(exc)}") from None
        else:
            steps = cardinality
        if limit:
            steps = min(steps, limit)
        from models import data as data_mod

        dataset = data_mod.tuned_dataset(dataset, cfg.train.prefetch, cfg.train.parallel_calls)
        return dataset.take(steps), steps, batch

    def execute(self) -> Path:
        with self._sigterm_stops_the_run():
            try:
                with self._onednn_lines():
                    return self._execute()
            except BaseException as exc:
                if self.stopped_by is not None and not isinstance(exc, KeyboardInterrupt):
                    # A signal cancelled the collective the loop was blocked in: the run was stopped.
                    raise (Terminated() if self.stopped_by == signal.SIGTERM else KeyboardInterrupt()) from exc
                raise

    def _execute(self) -> Path:
        resolved, arrays = self.prepare()
        if self._rearm_signals is not None:
            self._rearm_signals()
        self._open(self._initial_meta(resolved, arrays))
        try:
            self._keep_onednn_lines()
            self._save()
            self._start_job_record()
            self._train(resolved, arrays)
            self._close(strict=True)  # closing writes files too: a failure there fails the run
            self.meta["status"] = "complete"
        except BaseException as exc:
            self._mark_ended(exc)
            raise
        finally:
            try:
                self._stop_onednn_lines()
            finally:
                self._finish()
        return self._run_dir

    # ------------------------------------------------------------ --onednn-kernels

    @contextlib.contextmanager
    def _onednn_lines(self):
        """With --onednn-kernels, oneDNN's lines are taken off stdout for the whole run (before the run
        directory exists they are dropped), and the log is closed however the run ends."""
        if not self.config.onednn_kernels:
            yield
            return
        from profiler.train import onednn_verbose

        self.onednn = onednn_verbose.Diversion().__enter__()
        try:
            yield
        finally:
            self._stop_onednn_lines()

    def _keep_onednn_lines(self) -> None:
        if self.onednn is None:
            return
        from analysis.read.onednn_log import ONEDNN_LOG

        try:
            self.onednn.attach(self._run_dir / ONEDNN_LOG)
        except OSError as exc:
            self._profiler_warning(
                f"oneDNN's lines are not kept: cannot write {self._run_dir / ONEDNN_LOG} ({rundir.reason(exc)})"
            )

    def _stop_onednn_lines(self) -> None:
        """Stop taking oneDNN's lines (every one read, the log closed) and say what was kept."""
        diversion, self.onednn = self.onednn, None
        if diversion is None:
            return
        from profiler.train import onednn_verbose

        diversion.__exit__(None, None, None)
        if isinstance(self.meta, dict) and isinstance(self.meta.get("profiler"), dict):
            summary = diversion.summary()
            self.meta["profiler"]["onednn_verbose"] = summary
            warning = onednn_verbose.cap_warning(summary)
            if warning:
                self._profiler_warning(warning)

    def record_step(self, record) -> None:
        super().record_step(record)
        if self.onednn is not None and self.window is not None and self.window.done:
            self.onednn.keep_until(time.time())  # the trace is written: later lines are in none

    # ------------------------------------------------------------ training

    def _train(self, resolved, arrays) -> None:
        from models.cnn import build_cnn, train_flops_per_image
        from models.training import Trainer

        cfg = self.config
        if cfg.measure_peak:  # before the samplers and training, so nothing competes with it
            from profiler.roofline import peak

            self.console.print("Measuring the device's peak matmul rate and memory bandwidth...")
            with quiet.tensorflow_python_warnings_off():  # one tf.function per size tried: no retracing advice
                self.meta["peak"] = peak.record_for_run(resolved.kind, resolved.info.get("name"))
            if self.meta["peak"].get("cache_error"):
                self.console.warn(f"warning: {peak.not_cached_message(self.meta['peak']['cache_error'])}")
        self._start_recording(resolved)
        hooks = RunHooks(self)
        user = self.user_model
        if user is None:
            self.trainer = trainer = Trainer(resolved.strategy, build_cnn, arrays, self.train_config(), hooks)
            flops = train_flops_per_image(trainer.model)
        else:
            from models import user_model as um

            def build(precision):
                return um.build_model(user["function"], cfg.model, precision)

            self.trainer = trainer = Trainer(
                resolved.strategy,
                build,
                arrays,
                self.train_config(),
                hooks,
                loss_fn=user["loss"],
                classification=user["classification"],
                dataset=user["dataset"],
                steps_per_epoch=user["steps_per_epoch"],
            )
            flops = user["flops"]
        self.meta["model"] = {
            "name": trainer.model.name,
            "params": int(trainer.model.count_params()),
            "train_flops_per_image": flops,
        }
        self.meta["steps_per_epoch"] = trainer.steps_per_epoch
        if cfg.profile:
            total = trainer.steps_per_epoch * cfg.train.epochs
            start, stop = (
                tracing.parse_window(cfg.profile_steps)
                if cfg.profile_steps
                else tracing.default_window(trainer.steps_per_epoch, cfg.train.steps_per_execution, total)
            )
            if start >= total:
                self._profiler_warning(
                    f"profile window {start}:{stop} is never reached: the run has "
                    f"{total} steps; no trace will be written"
                )
            else:
                # A call never crosses an epoch: with N > the epoch's steps, each call is one epoch.
                per_call = min(cfg.train.steps_per_execution, trainer.steps_per_epoch)
                self._open_window(start, min(stop, total), resolved.kind, per_call)
        self._save()
        trainer.fit()
        if arrays is None:  # the user's dataset: no test set
            return
        self.console.print(evaluation_message(len(arrays.x_test), cfg.limit_test_images))
        began = time.perf_counter()
        test_loss, test_accuracy = trainer.evaluate()
        self.meta["test"] = {
            "loss": test_loss,
            "accuracy": test_accuracy,
            "images": len(arrays.x_test),
            "seconds": time.perf_counter() - began,
        }
        self.console.print(f"test_loss: {test_loss:.4f} - test_accuracy: {test_accuracy:.4f}")

    def train_config(self):
        """The training options this process trains with: an injected cost named for one worker
        (`MS@WORKER`) is paid by that worker only."""
        cfg = self.config
        index = cfg.cluster.index if cfg.cluster is not None else None
        injected_input, injected_host = cfg.injections()
        return dataclasses.replace(
            cfg.train,
            inject_input_delay_ms=injected_input.for_worker(index),
            inject_host_delay_ms=injected_host.for_worker(index),
        )

    # ------------------------------------------------------------ run.json

    def _initial_meta(self, resolved, arrays) -> dict:
        from profiler.record.session import starting_meta

        cfg = self.config
        config = asdict(cfg)
        config.update(config.pop("train"))
        config.pop("cluster")
        validated = min(cfg.train.validation_images, len(arrays.x_test)) if arrays is not None else 0
        config["validation_images"] = validated  # as validated: the test set may be smaller than asked
        data = (
            {
                "source": arrays.source,
                "path": arrays.path,
                "train_images": len(arrays.x_train),
                "val_images": validated,
                "test_images": len(arrays.x_test),
            }
            if arrays is not None
            else {"source": "dataset", "path": cfg.dataset, "train_images": None, "val_images": 0, "test_images": 0}
        )
        meta = starting_meta(resolved, config, cfg.profile, data=data)
        if cfg.cluster is not None:
            cluster = cfg.cluster
            train = self.train_config()
            meta["worker"] = self._worker_meta()
            meta["global_batch_size"] = cfg.train.batch_size
            meta["per_worker_batch_size"] = cfg.train.batch_size // cluster.num_workers
            meta["injected"] = {
                "input_delay_ms": train.inject_input_delay_ms,
                "host_delay_ms": train.inject_host_delay_ms,
            }
        return meta


def example_bytes(x) -> int:
    """Bytes of one example as the pipeline gives it (float32)."""
    return 4 * max(1, math.prod(x.shape[1:]))


def batch_memory_problem(batch_size: int, per_example: int) -> str | None:
    """Why a full batch of `batch_size` examples could not be allocated in this machine's memory, or None."""
    import psutil

    need, memory = batch_size * per_example, psutil.virtual_memory().total
    if need <= memory:
        return None
    return (
        f"a full batch of that size needs {need / 2**30:,.0f} GiB as float32, more than this machine's "
        f"{memory / 2**30:,.0f} GiB of memory"
    )


def _shape(value):
    """A batch's shape, or its tuple or dict of shapes."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda leaf: tuple(getattr(leaf, "shape", ())), value)


def _check_inputs(name: str, model, x) -> None:
    """A batch with another number of inputs than the model takes: said with both shapes, in one line,
    before Keras would quote the batch's values."""
    from models import user_model as um

    try:
        wanted = len(model.inputs)
    except Exception:  # noqa: BLE001 - a subclassed model not built yet: Keras will say
        return
    given = len(x) if isinstance(x, (tuple, list, dict)) else 1
    if wanted and given != wanted:
        raise um.ModelError(
            f"--model {name}: a batch has {given} input{'s' if given != 1 else ''} "
            f"(x {_shape(x)}) and the model takes {wanted}{_model_shapes(model)}"
        )


def _model_shapes(model) -> str:
    """`; model input (None, 8), output (None, 3)` where the model knows them (a list for several)."""

    def shapes(tensors):
        listed = [tuple(t.shape) for t in tensors]
        return listed[0] if len(listed) == 1 else listed

    try:
        return f"; model input {shapes(model.inputs)}, output {shapes(model.outputs)}"
    except Exception:  # noqa: BLE001 - a subclassed model not built yet
        return ""


def evaluation_message(test_images: int, limit_test_images: int | None) -> str:
    """What the test pass at the end does: the whole test set, or the first N (--limit-test-images)."""
    if limit_test_images is not None and test_images >= limit_test_images:
        return f"Evaluating on the first {test_images:,} test images (--limit-test-images)..."
    return f"Evaluating on the whole test set ({test_images:,} images)..."
