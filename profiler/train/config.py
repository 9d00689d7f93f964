"""What a run is asked to do (`RunConfig`) and the checks on it that come before anything is written."""

from __future__ import annotations

import math
import os
import unicodedata
from dataclasses import dataclass, field

from models.training import TrainConfig
from profiler import samplers
from profiler.device import cluster as cluster_mod
from profiler.record import tracing


class UsageError(Exception):
    """Bad options or a missing device/data: `error: ...`, exit code 2."""


NAME_MAX_BYTES = 255  # the longest file name Linux, macOS and Windows file systems take
MAX_SEED = 2**32 - 1  # the largest seed Keras, NumPy and tf.data all take
MAX_INJECTED_DELAY_MS = 60_000.0  # a cost injected in every step: more is a run that never ends


def check_finite(option: str, value: float, minimum: float = 0.0, unit: str = "") -> str | None:
    """Why `value` cannot be `option`'s value (not a number, NaN, infinite, below `minimum`), or None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        return f"{option} must be a finite number >= {minimum:g}{unit} (got {value!r})"
    if number < minimum:
        return f"{option} must be at least {minimum:g}{unit} (got {value!r})"
    return None


def check_run_name(name: str) -> str | None:
    """Why `name` cannot be a run folder's name, or None: a run name is one path component."""
    if name == "":
        return "--run-name cannot be empty"
    if "\0" in name:
        return "--run-name cannot contain a NUL character"
    # Newlines and other control characters break every line-based output the name appears in
    # (logs, CSVs, Markdown tables) and can hide what the name really is.
    control = next((c for c in name if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if control is not None:
        return (
            f"--run-name {name!r} contains the control character U+{ord(control):04X}; a run name is "
            "one line of printable text"
        )
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    found = sorted(sep for sep in separators if sep in name)
    if found:
        return (
            f"--run-name {name!r} contains {' and '.join(repr(sep) for sep in found)}: a run name is one "
            f"folder name inside --out, not a path (use --out for where it goes)"
        )
    if name in (".", ".."):
        return f"--run-name cannot be {name!r}: a run name is one new folder inside --out"
    try:
        size = len(os.fsencode(name))
    except UnicodeError:
        return f"--run-name {name!r} cannot be encoded as a file name on this system"
    if size > NAME_MAX_BYTES:
        return f"--run-name is {size} bytes long; a file name has at most {NAME_MAX_BYTES}"
    return None


def check_environment() -> None:
    """Raise `UsageError` naming a DEVPROF_* environment variable a run reads that cannot work.
    Checked with the options, before anything is written: a worker that found it later would
    leave a failed job folder behind."""
    from profiler.device import devices

    for read in (devices.tpu_timeout_s, devices.cluster_wait_s):
        try:
            read()
        except devices.DeviceError as exc:
            raise UsageError(str(exc)) from None


@dataclass
class RunConfig:
    device: str = "auto"
    gpus: int | None = None
    tpu: str | None = None
    data: str = "auto"
    data_dir: str | None = None
    limit_images: int | None = None
    limit_test_images: int | None = None
    out: str = "runs"
    run_name: str | None = None
    train: TrainConfig = field(default_factory=TrainConfig)
    profile: bool = True
    profile_steps: str | None = None
    tracer: tracing.TracerOptions = field(default_factory=tracing.TracerOptions)
    profiler_port: int | None = None
    scalars_every: int = 10
    sample: bool = True
    sample_interval: float = 0.5
    measure_peak: bool = False
    quiet: bool = False
    # Several workers (TF_CONFIG, --cluster, or one of `devprof run --workers N`'s processes).
    cluster: cluster_mod.Cluster | None = None
    inject_input_worker: int | None = None  # --inject-input-delay-ms MS@WORKER: only that worker
    inject_host_worker: int | None = None
    collective_timeout_s: float = 60.0
    model: str | None = None  # --model MODULE:FUNCTION: the user's Keras model instead of the CNN
    dataset: str | None = None  # --dataset MODULE:FUNCTION: the user's (x, y) batches
    loss: str | None = None  # --loss NAME: a Keras loss for --model
    onednn_kernels: bool = False  # --onednn-kernels: keep oneDNN's execution lines in onednn_verbose.log
    tensorflow_defaults: bool = False  # --tensorflow-defaults: TensorFlow's own CPU kernels and threads

    @property
    def num_workers(self) -> int:
        return self.cluster.num_workers if self.cluster is not None else 1

    def injections(self) -> tuple[cluster_mod.Injection, cluster_mod.Injection]:
        """(input delay, host delay) as asked, each for one worker or all."""
        t = self.train
        return (
            cluster_mod.Injection(t.inject_input_delay_ms, self.inject_input_worker),
            cluster_mod.Injection(t.inject_host_delay_ms, self.inject_host_worker),
        )

    def validate(self) -> None:
        """Raise `UsageError` naming the first option that cannot work."""
        t = self.train
        checks = [
            (t.epochs >= 1, f"--epochs must be at least 1 (got {t.epochs})"),
            (t.batch_size >= 1, f"--batch-size must be at least 1 (got {t.batch_size})"),
            (t.steps_per_execution >= 1, f"--steps-per-execution must be at least 1 (got {t.steps_per_execution})"),
            (
                self.limit_images is None or self.limit_images >= 1,
                f"--limit-images must be at least 1 (got {self.limit_images})",
            ),
            (
                self.limit_test_images is None or self.limit_test_images >= 1,
                f"--limit-test-images must be at least 1 (got {self.limit_test_images})",
            ),
            (self.scalars_every >= 1, f"--scalars-every must be at least 1 (got {self.scalars_every})"),
            (
                self.profiler_port is None or 1 <= self.profiler_port <= 65535,
                f"--profiler-port must be a port number from 1 to 65535 (got {self.profiler_port})",
            ),
            # Keras, NumPy and tf.data take seeds of 32 bits: outside them training failed after the run
            # directory was made.
            (0 <= t.seed <= MAX_SEED, f"--seed must be a whole number from 0 to {MAX_SEED} (got {t.seed})"),
            # Options of the profiler window that --no-profile leaves without a window were ignored in silence.
            (
                self.profile or self.profile_steps is None,
                f"--profile-steps {self.profile_steps} sets the traced window and --no-profile traces none: "
                "leave one of them out",
            ),
            (
                self.profile or not self.tracer.python_tracer_level,
                "--python-tracer traces Python calls in the profiler window and --no-profile traces none: "
                "leave one of them out",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        # Every float option: NaN and infinity pass `>=` checks the wrong way, so say what is wanted.
        for option, value, minimum, unit, below in (
            ("--inject-input-delay-ms", t.inject_input_delay_ms, 0.0, "", ""),
            ("--inject-host-delay-ms", t.inject_host_delay_ms, 0.0, "", ""),
            (
                "--sample-interval",
                self.sample_interval,
                samplers.MIN_INTERVAL_S,
                " s",
                ": shorter intervals cost more than they show",
            ),
            ("--collective-timeout-s", self.collective_timeout_s, 1.0, " s", ""),
        ):
            problem = check_finite(option, value, minimum, unit)
            if problem:
                raise UsageError(problem + (below if problem.startswith(f"{option} must be at least") else ""))
        for option, value in (
            ("--inject-input-delay-ms", t.inject_input_delay_ms),
            ("--inject-host-delay-ms", t.inject_host_delay_ms),
        ):
            if value > MAX_INJECTED_DELAY_MS:  # slept in every step: 1e9 ms was a run that never ended
                raise UsageError(
                    f"{option} must be at most {MAX_INJECTED_DELAY_MS:g} (a minute in every step; got {value:g})"
                )
        if self.model is None and (self.dataset is not None or self.loss is not None):
            raise UsageError(
                f"{'--dataset' if self.dataset is not None else '--loss'} goes with --model "
                "MODULE:FUNCTION (the CNN trains on CIFAR-10 or synthetic data with its own loss)"
            )
        if self.model is not None and self.dataset is None and (t.prefetch is not None or t.parallel_calls is not None):
            raise UsageError(
                f"{'--prefetch' if t.prefetch is not None else '--parallel-calls'} sets the CNN's own "
                "pipeline, or your --dataset's; --model alone trains on arrays in memory"
            )
        if self.dataset is not None and t.parallel_calls not in (None, -1):
            raise UsageError(
                f"--parallel-calls {t.parallel_calls}: with --dataset only auto (tf.data parallelizes your "
                "pipeline's stateless maps itself; a number cannot reach maps it has already made)"
            )
        if self.dataset is not None and self.data not in ("auto", "synthetic"):
            raise UsageError(f"--dataset replaces --data; leave --data {self.data} out")
        if self.onednn_kernels and not self.profile:
            raise UsageError(
                "--onednn-kernels names the oneDNN kernel of each traced op: it needs the profile "
                "window (leave --no-profile out)"
            )
        if self.onednn_kernels and self.device in ("gpu", "tpu"):
            raise UsageError(
                f"--onednn-kernels names oneDNN's CPU kernels; --device {self.device} runs the step's "
                "ops on the device (use it with --device cpu)"
            )
        self._validate_workers()
        if self.run_name is not None:
            problem = check_run_name(self.run_name)
            if problem:
                raise UsageError(problem)
        if self.profile_steps:
            try:
                tracing.parse_window(self.profile_steps)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        check_environment()

    def _validate_workers(self) -> None:
        workers = self.cluster.num_workers if self.cluster is not None else None
        for option, injection in zip(("--inject-input-delay-ms", "--inject-host-delay-ms"), self.injections()):
            problem = cluster_mod.check_injection(option, injection, workers)
            if problem:
                raise UsageError(problem)
        if self.cluster is None:
            return
        workers = self.cluster.num_workers
        if self.run_name is None:
            raise UsageError(
                f"--run-name is required with {self.cluster.source}: every worker writes its "
                "worker-<i>/ folder into the same <out>/<run-name>/ job folder"
            )
        if self.device == "tpu":
            raise UsageError(
                "several workers train with MultiWorkerMirroredStrategy on CPUs or GPUs; a TPU pod "
                "is one TPUStrategy job (use --device tpu --tpu ADDRESS without a cluster)"
            )
        if self.train.batch_size % workers:
            low = self.train.batch_size - self.train.batch_size % workers
            raise UsageError(
                f"--batch-size {self.train.batch_size} is the global batch and must split evenly "
                f"among {workers} workers (e.g. {max(low, workers)} or {low + workers})"
            )
