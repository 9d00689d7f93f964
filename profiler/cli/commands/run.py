"""`devprof run`: train the seed CIFAR-10 CNN under the profiler and samplers, into a new run directory."""

from __future__ import annotations

import argparse
import os
import sys

from profiler.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    TRACER_OPTIONS,
    DefaultsHelpFormatter,
    Option,
    error,
    option,
    tracer_options,
)


class _StoreGiven(argparse.Action):
    """Stores the value, and that the option was given (`<dest>_given`): its default still shows in --help."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def batches(text: str) -> int:
    """`--prefetch` and `--parallel-calls`: a whole number of batches from 1, or `auto` (tf.data.AUTOTUNE, -1)."""
    if text.strip().lower() == "auto":
        return -1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of batches from 1, or auto; got {text!r}")
    return value


def injection(text: str):
    """`--inject-*-delay-ms MS[@WORKER]` as (ms, worker or None); the number is checked later, with
    the other float options."""
    from profiler.device.cluster import parse_injection

    try:
        return parse_injection(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# `devprof run`'s options by help group, as data: the parser is built from them, and `--workers`
# passes on to each worker the ones it was given (`launcher.child_options`).
GROUPS: tuple[tuple[str, tuple[Option, ...]], ...] = (
    (
        "device",
        (
            option("--device", default="auto", help="auto|cpu|gpu|tpu (auto: TPU, else GPU, else CPU)"),
            option("--gpus", type=int, default=None, help="GPUs to train on (MirroredStrategy when >1)"),
            option("--tpu", default=None, help="TPU name or grpc:// address (default: local or from the environment)"),
        ),
    ),
    (
        "data",
        (
            option(
                "--data",
                choices=["auto", "cifar10", "synthetic"],
                default="auto",
                help="auto: local CIFAR-10 if found, else synthetic",
            ),
            option("--data-dir", default=None, help="folder holding CIFAR-10 (python or binary version)"),
            option(
                "--limit-images",
                type=int,
                default=None,
                help="train on the first N images (fewer than --batch-size: one short batch of N per epoch)",
            ),
            option(
                "--limit-test-images",
                type=int,
                default=None,
                metavar="N",
                help="validate and test on the first N test images (default: all; validation uses at most 1,000)",
            ),
            option(
                "--model",
                default=None,
                metavar="MODULE:FUNCTION",
                help="train your own Keras model instead of the CNN: a function returning an uncompiled model "
                "(MODULE importable from the current folder, or FILE.py:FUNCTION); data: synthetic, "
                "shaped from the model, or --dataset",
            ),
            option(
                "--dataset",
                default=None,
                metavar="MODULE:FUNCTION",
                help="with --model: a function returning a tf.data dataset of (x, y) batches (x: a tensor, or a "
                "tuple or dict of tensors for several inputs)",
            ),
            option(
                "--loss",
                default=None,
                metavar="NAME",
                help="with --model: a Keras loss name (default: sparse categorical cross-entropy, from logits "
                "when the model's last layer has no softmax)",
            ),
            option(
                "--prefetch",
                type=batches,
                default=None,
                metavar="N|auto",
                help="the CNN's pipeline: keep N batches ready after its last stage, the injected input delay's "
                "included (auto: tf.data's AUTOTUNE; default: the seed program's pipeline)",
            ),
            option(
                "--parallel-calls",
                type=batches,
                default=None,
                metavar="N|auto",
                help="the CNN's pipeline: run each of its map stages, the injected input delay's included, on N "
                "batches at once (auto: tf.data's AUTOTUNE; default: the seed program's pipeline)",
            ),
        ),
    ),
    (
        "training",
        (
            option("--epochs", type=int, default=2, help="epochs (the seed program: 10)"),
            option("--batch-size", type=int, default=100, help="global batch size (the seed: 100)"),
            option(
                "--precision",
                choices=["float32", "mixed_float16", "mixed_bfloat16"],
                default="float32",
                help="compute dtype policy",
            ),
            option("--jit-compile", action="store_true", help="compile the step with XLA"),
            option(
                "--tensorflow-defaults",
                action="store_true",
                help="CPU: keep TensorFlow's own kernels and threads (oneDNN only where TensorFlow turns it on, "
                "as many ops at once as cores), as a program runs outside devprof; by default devprof turns "
                "oneDNN on and runs one op at a time per CPU socket",
            ),
            option("--steps-per-execution", type=int, default=1, help="training steps inside one tf.function call"),
            option("--seed", type=int, default=0, help="random seed of the model, data and shuffling"),
            option(
                "--measure-peak",
                action="store_true",
                help="record the device's measured matmul FLOP/s and bandwidth in run.json (cached per device)",
            ),
            option(
                "--inject-input-delay-ms",
                type=injection,
                default=injection("0"),
                metavar="MS[@WORKER]",
                help="make every batch this much slower to produce (a demo of an input-bound job); "
                "MS@WORKER: on that worker only (a straggler)",
            ),
            option(
                "--inject-host-delay-ms",
                type=injection,
                default=injection("0"),
                metavar="MS[@WORKER]",
                help="add this much Python work per step (a demo of a host-bound job); MS@WORKER: on that worker only",
            ),
        ),
    ),
    (
        "several workers (MultiWorkerMirroredStrategy)",
        (
            option(
                "--workers",
                type=int,
                default=None,
                metavar="N",
                per_worker=True,
                help="start N worker processes on this machine, each with its share of the cores, "
                "and wait for them (the job's run directory holds worker-<i>/ for each)",
            ),
            option(
                "--oversubscribe",
                action="store_true",
                per_worker=True,
                help="with --workers: start them even when they are more than this machine's cores, or "
                "need more memory than it has free (about 1.5 GiB each)",
            ),
            option(
                "--cluster",
                default=None,
                metavar="HOST:PORT,...",
                per_worker=True,
                help="this host is one worker of a job on these hosts (chief first); needs --task-index "
                "and --run-name. Without it, TF_CONFIG in the environment is used when set",
            ),
            option(
                "--task-index",
                type=int,
                default=None,
                metavar="I",
                per_worker=True,
                help="which worker of --cluster (or of TF_CONFIG) this host is; 0 is the chief",
            ),
            option(
                "--collective-timeout-s",
                type=float,
                default=60.0,
                metavar="S",
                help="seconds a collective (all-reduce) may wait for the other workers before it fails the job",
            ),
        ),
    ),
    (
        "output",
        (
            option("--out", metavar="DIR", default="runs", per_worker=True, help="folder the run directory goes into"),
            option(
                "--run-name",
                default=None,
                per_worker=True,
                help="run folder name (default: <time>-<device>-<host>, with -2, -3, ... when taken)",
            ),
            option("--quiet", action="store_true", per_worker=True, help="no progress output"),
            option("--scalars-every", type=int, default=10, help="write step scalars every N steps"),
        ),
    ),
    (
        "profiler",
        (
            option("--no-profile", dest="profile", action="store_false", help="no profiler window"),
            option(
                "--profile-steps",
                default=None,
                metavar="START:STOP",
                help="global steps to trace, STOP exclusive (default: whole calls after warm-up, 10 steps' worth and "
                "at least 5 calls; with --steps-per-execution N > 1, from the second call, step N)",
            ),
            *TRACER_OPTIONS,
            option(
                "--onednn-kernels",
                action="store_true",
                help="CPU: keep oneDNN's line for each primitive it runs (ONEDNN_VERBOSE=profile_exec) in "
                "<run>/onednn_verbose.log, so analyze names the implementation that ran each op "
                "(jit:avx2, brg_conv_fwd:avx2, ...)",
            ),
            option(
                "--profiler-port",
                type=int,
                default=None,
                per_worker=True,
                help="start a profiler server on this port for on-demand capture (off by default; it "
                "listens on all network interfaces without authentication: use only on a trusted network); "
                "with --workers N, worker i listens on PORT + i",
            ),
        ),
    ),
    (
        "samplers",
        (
            option("--no-sample", dest="sample", action="store_false", help="no utilization sampling"),
            option(
                "--sample-interval",
                type=float,
                default=0.5,
                action=_StoreGiven,
                help="seconds between samples (minimum 0.05)",
            ),
        ),
    ),
)
OPTIONS = tuple(each for _, group in GROUPS for each in group)


def add_parser(sub) -> argparse.ArgumentParser:
    run = sub.add_parser(
        "run",
        help="train the seed CIFAR-10 CNN under the profiler and samplers",
        description="Train the seed CIFAR-10 CNN with a custom tf.function loop, "
        "writing a run directory (run.json, steps.csv, utilization CSVs, trace).",
        formatter_class=DefaultsHelpFormatter,
    )
    for title, options in GROUPS:
        group = run.add_argument_group(title)
        for each in options:
            each.add_to(group)
    run.set_defaults(handler=handle)
    return run


def _a_valid_interval(seconds: float) -> bool:
    from profiler import samplers
    from profiler.train.config import check_finite

    return check_finite("--sample-interval", seconds, samplers.MIN_INTERVAL_S, " s") is None


def build_config(args: argparse.Namespace, cluster=None):
    """The `RunConfig` the options ask for (`cluster`: this process's place in a multi-worker job)."""
    from models.training import TrainConfig
    from profiler.train.config import RunConfig

    return RunConfig(
        device=args.device,
        gpus=args.gpus,
        tpu=args.tpu,
        data=args.data,
        data_dir=args.data_dir,
        limit_images=args.limit_images,
        limit_test_images=args.limit_test_images,
        out=args.out,
        run_name=args.run_name,
        train=TrainConfig(
            batch_size=args.batch_size,
            epochs=args.epochs,
            precision=args.precision,
            jit_compile=args.jit_compile,
            steps_per_execution=args.steps_per_execution,
            seed=args.seed,
            inject_input_delay_ms=args.inject_input_delay_ms.ms,
            inject_host_delay_ms=args.inject_host_delay_ms.ms,
            prefetch=args.prefetch,
            parallel_calls=args.parallel_calls,
        ),
        profile=args.profile,
        profile_steps=args.profile_steps,
        tracer=tracer_options(args),
        profiler_port=args.profiler_port,
        scalars_every=args.scalars_every,
        sample=args.sample,
        sample_interval=args.sample_interval,
        measure_peak=args.measure_peak,
        quiet=args.quiet,
        cluster=cluster,
        inject_input_worker=args.inject_input_delay_ms.worker,
        inject_host_worker=args.inject_host_delay_ms.worker,
        collective_timeout_s=args.collective_timeout_s,
        model=args.model,
        dataset=args.dataset,
        loss=args.loss,
        onednn_kernels=args.onednn_kernels,
        tensorflow_defaults=args.tensorflow_defaults,
    )


def handle(args: argparse.Namespace) -> int:
    from profiler.device import cluster as cluster_mod
    from profiler.device import devices
    from profiler.record import rundir
    from profiler.train.config import UsageError
    from profiler.train.run import Run, Terminated

    if not args.sample and getattr(args, "sample_interval_given", False) and _a_valid_interval(args.sample_interval):
        # was ignored in silence (an interval that cannot work is refused as such, by the checks of every run)
        return error(
            f"--sample-interval {args.sample_interval:g} sets how often the samplers sample and --no-sample "
            "runs none: leave one of them out"
        )
    if args.tensorflow_defaults:
        devices.keep_tensorflow_defaults()  # inherited by the workers
    devices.prefer_onednn()  # before TensorFlow is imported, here or in the workers
    if args.onednn_kernels:
        from profiler.train import onednn_verbose

        problem = onednn_verbose.problem()
        if problem:
            return error(problem)
        if args.workers is None:  # each worker turns oneDNN's lines on for itself
            onednn_verbose.configure()
    if args.workers is not None:
        from profiler.cli import launcher

        return launcher.launch(args, build_config, OPTIONS)
    try:
        cluster = cluster_mod.resolve(args.cluster, args.task_index)
    except cluster_mod.ClusterError as exc:
        return error(str(exc))
    if args.cluster is not None and os.environ.get(cluster_mod.TF_CONFIG):
        print("warning: --cluster replaces the TF_CONFIG of the environment", file=sys.stderr)
    run = Run(build_config(args, cluster))
    try:
        path = run.execute()
    except (UsageError, rundir.RunExistsError) as exc:
        return error(str(exc))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (`Terminated`)
        terminated = isinstance(exc, Terminated)
        what = "terminated (SIGTERM)" if terminated else "interrupted"
        if run.recorded:
            kept = f"run directory {run.path} kept with status 'interrupted'"
        elif run.path is not None and run.path.is_dir():
            kept = f"run directory {run.path} kept, but its run.json could not be updated"
        else:
            kept = "no run directory was written"
        print(f"\n{what}: {kept}", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except rundir.WriteError as exc:
        return error(f"run failed: {exc}{_where(run, 'the run is marked failed in')}", code=EXIT_FAILURE)
    except Exception as exc:  # noqa: BLE001 - a crash is recorded in run.json; say where
        return error(f"training failed: {type(exc).__name__}: {exc}{_where(run, 'details in')}", code=EXIT_FAILURE)
    run.console.print(f"run directory: {path}")
    return EXIT_OK


def _where(run, what: str) -> str:
    """Where the run says how it ended: only a run.json that was written (on a full disk it may not be)."""
    if run.recorded:
        return f"; {what} {run.path / 'run.json'}"
    if run.path is not None and run.path.is_dir():
        return f"; {run.path / 'run.json'} could not be updated"
    return ""
