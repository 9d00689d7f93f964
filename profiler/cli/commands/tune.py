"""`devprof tune`: apply the analysis' fixes in short alternated trials, keep what helps, and give the
fastest setting this device trains at (`profiler.cli.tune`)."""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from pathlib import Path

from profiler.cli.commands import run as run_command
from profiler.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, DefaultsHelpFormatter, error

# `devprof run`'s options that a tune sets itself, or that make no sense for one process's trials.
NOT_FOR_TUNE = {
    "--workers",
    "--oversubscribe",
    "--cluster",
    "--task-index",
    "--no-profile",
    "--profile-steps",
    "--profiler-port",
    "--epochs",
    "--quiet",
    "--no-sample",
    "--sample-interval",
}


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: tune.json keeps every finished trial."""


def _budget(text: str) -> float:
    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not (math.isfinite(minutes) and minutes > 0):
        raise argparse.ArgumentTypeError(f"expected minutes above 0, got {text!r}")
    return minutes


def add_parser(sub) -> argparse.ArgumentParser:
    from profiler.cli import tune

    parser = sub.add_parser(
        "tune",
        help="try the analysis' fixes in short alternated trials and keep what helps",
        description="Start from TensorFlow's own setting (--tensorflow-defaults: as your program runs outside "
        "devprof), run a short profiled baseline, then try each fix the analysis ranks (steps per call, "
        "precision, the pipeline's prefetch and parallel calls, XLA, oneDNN, TensorFlow's threads, a larger "
        "batch within the measured memory headroom) in short trials "
        "alternated with the baseline, keep those that are faster beyond the noise, and try again "
        "from there until nothing saves more or the budget is spent. Writes tune.json, report.html and one run "
        "folder per trial under <out>/<run-name>/.",
        formatter_class=DefaultsHelpFormatter,
    )
    own = parser.add_argument_group("tune")
    own.add_argument(
        "--budget",
        type=_budget,
        default=tune.DEFAULT_BUDGET_MIN,
        metavar="MINUTES",
        help="no trial starts after this much time; the last one finishes",
    )
    for title, options in run_command.GROUPS:
        group = parser.add_argument_group(title)
        for each in options:
            if each.flag not in NOT_FOR_TUNE:
                each.add_to(group)
    parser.set_defaults(
        handler=handle,
        workers=None,
        cluster=None,
        task_index=None,
        profile=True,
        profile_steps=None,
        profiler_port=None,
        epochs=1,
        quiet=False,
        sample=True,
        sample_interval=0.5,
        oversubscribe=False,
    )
    return parser


def handle(args: argparse.Namespace) -> int:
    from profiler.cli import launcher, tune
    from profiler.train.config import UsageError

    try:  # every option checked before any trial starts
        run_command.build_config(args).validate()
    except UsageError as exc:
        return error(str(exc))
    name = args.run_name or time.strftime("tune-%Y%m%d-%H%M%S")
    tune_dir = Path(args.out) / name
    try:
        tune_dir.mkdir(parents=True)
    except FileExistsError:
        return error(f"{tune_dir} exists: pass another --run-name (a tune never writes into an earlier one)")
    except OSError as exc:
        return error(f"cannot make {tune_dir}: {exc.strerror or exc}")
    # The user's own run options: the trials add theirs, and the best setting's command is the user's plus its fixes.
    user_argv = launcher.given_options(args, [each for each in run_command.OPTIONS if each.flag not in NOT_FOR_TUNE])
    tuner = tune.Tuner(
        tune_dir,
        user_argv,
        args.budget * 60.0,
        batch_size=args.batch_size,
        epoch_images=args.limit_images or tune.SEED_EPOCH_IMAGES,
        pipeline="cnn" if args.model is None else ("dataset" if args.dataset else None),
        say=lambda line: print(line, file=sys.stderr),
    )
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    code = EXIT_OK
    try:
        document = tuner.run()
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        tuner.document["status"] = "interrupted"
        document = tuner.document
        code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    tuner.write()
    print(tune.render_text(document))
    print(f"wrote {tune_dir / 'tune.json'} and {tune_dir / 'report.html'}", file=sys.stderr)
    return EXIT_FAILURE if code == EXIT_OK and document["status"] == "failed" else code


def _raise_terminated(signum, frame):
    raise _Terminated()
