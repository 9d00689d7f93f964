"""`--perfetto FILE` and `--perfetto-events` of `analyze` and `compare`: the analysis as a Perfetto trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.cli.common import EXIT_FAILURE, error, file_warnings

EVENT_CHOICES = ("ops", "all", "none")  # analysis/render/perfetto.py's, without importing it for --help


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--perfetto",
        metavar="FILE",
        default=None,
        help="also write the analysed timeline as a Perfetto trace (open it at ui.perfetto.dev): "
        "steps and their parts, devices' busy and idle spans, findings, sampler and memory "
        "counters, one process per worker",
    )
    parser.add_argument(
        "--perfetto-events",
        choices=EVENT_CHOICES,
        default=None,
        help="the trace's own events in the Perfetto trace: ops (host ops and device kernels), "
        "all, or none (default: ops)",
    )


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, before anything is analysed (None: nothing)."""
    if args.perfetto is None:
        return "--perfetto-events needs --perfetto FILE" if args.perfetto_events is not None else None
    path = Path(args.perfetto)
    if path.is_dir():
        return f"--perfetto {path}: is a folder; name the trace file, e.g. {path / 'trace.pftrace'}"
    if not path.parent.is_dir() and not path.parent.parent.is_dir():  # the last folder alone is made, as for -o
        return f"--perfetto {path}: no folder {path.parent.parent}"
    return None


def write(args: argparse.Namespace, result, inputs=None) -> int | None:
    """Write the trace of `result` (an Analysis or a Comparison; `inputs`: the Analysis' own files as the
    analysis read them); an exit code on failure, else None."""
    path = Path(args.perfetto)
    events = args.perfetto_events or "ops"
    try:
        path.parent.mkdir(exist_ok=True)  # the last folder only, as -o: a mistyped path is an error
        with file_warnings():
            if getattr(result, "KIND", "analysis") == "comparison":
                from analysis.comparison import write_perfetto as write_comparison

                written = write_comparison(result, path, events)
            else:
                from analysis.worker import write_perfetto as write_analysis

                written = write_analysis(result, path, events, getattr(args, "step_name", None), inputs)
    except OSError as exc:
        return error(f"cannot write {path}: {exc.strerror or exc}", code=EXIT_FAILURE)
    print(
        f"wrote {path}: {written.processes} process{'es' if written.processes != 1 else ''}, {written.events:,} events",
        file=sys.stderr,
    )
    return None
