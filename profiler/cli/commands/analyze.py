"""`devprof analyze PATH`: break step and epoch time into input, compute and host overhead.

Calls one analysis entry point (`analysis.pipeline.analyzed`, with the helpers that lend it another core)
and renders its result. User
mistakes print one `error: ...` line, never a traceback: exit 2 for a missing path, 1 when
nothing can be analysed or the outputs cannot be written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.render import format_for_path, format_of_output, formats_for
from profiler.cli.commands import perfetto_option
from profiler.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_USAGE,
    add_format_option,
    error,
    file_warnings,
    output_file_problem,
    outputs_problem,
    write_stdout,
)

if TYPE_CHECKING:
    from analysis.parallel import Helpers


def add_parser(sub) -> argparse.ArgumentParser:
    analyze = sub.add_parser(
        "analyze",
        help="break step time into input, compute and host overhead",
        description="Break step and epoch time into input, compute and host overhead, and say what limits the device.",
    )
    analyze.add_argument(
        "path",
        help="a devprof run directory, a TensorBoard log folder, a profile session folder or an .xplane.pb file",
    )
    add_format_option(
        analyze,
        formats_for("analysis"),
        "what to print on stdout; with --output, from its extension (.html, .md, .json, .csv, .txt)",
    )
    analyze.set_defaults(format=None)
    analyze.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        default=None,
        help="write the analysis to FILE instead of stdout, e.g. report.html (a self-contained page)",
    )
    analyze.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write CSVs, plots and report.md here (default: <run>/analysis for run directories)",
    )
    analyze.add_argument(
        "--step-name",
        metavar="REGEX",
        default=None,
        help="the step marker or program execution (tf.function, XLA program) that stands for one "
        "step, when the automatic choice is not the training step",
    )
    analyze.add_argument(
        "--fail-on",
        metavar="PART>PCT,...",
        default=None,
        help=f"exit {EXIT_REGRESSION} when a part's share of step time is above its limit, e.g. "
        "'input>20,host>15' (parts: input, compute, host, collective)",
    )
    analyze.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="analyse a job's workers on the Dask cluster whose scheduler is at ADDRESS "
        "(tcp://host:8786), each where its trace lies: every Dask worker must see PATH at its "
        "absolute path on this machine (shared storage); "
        "default: processes on this machine. Needs pip install -e '.[cluster]'",
    )
    peak = analyze.add_mutually_exclusive_group()
    peak.add_argument(
        "--peak-tflops",
        metavar="TFLOPS",
        default=None,
        help="the device's peak for the roofline, in TFLOP/s: one number for every dtype (1307) or "
        "per dtype (bfloat16=1307,float32=163); default: the run's measured peak (run.json)",
    )
    peak.add_argument(
        "--peak-file",
        metavar="FILE",
        default=None,
        help="the ceilings for the roofline from a 'devprof peak --format json' result measured on the "
        "device the trace comes from",
    )
    perfetto_option.add_options(analyze)
    analyze.set_defaults(handler=handle)
    return analyze


def _ceilings(args: argparse.Namespace):
    """The user's ceilings (None: the run's own); a ValueError says what is wrong with them."""
    from analysis.breakdown import roofline
    from analysis.read import run_files

    if args.peak_tflops is not None:
        return roofline.ceilings_from_tflops(roofline.parse_peak_tflops(args.peak_tflops))
    if args.peak_file is not None:
        try:
            ceilings = roofline.ceilings_from_peak(run_files.read_peak_file(args.peak_file), "peak file")
        except run_files.RunFileError as exc:
            raise ValueError(f"--peak-file {exc}") from None
        if ceilings is None:
            raise ValueError(f"--peak-file {args.peak_file}: holds no measured ceiling")
        return ceilings
    return None


def _out_dir_problem(out: str | None) -> str | None:
    """Why `--out DIR` cannot hold the files, found before the analysis (was exit 1 after it, 'File exists')."""
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        return f"--out {out}: is a file, not a folder; name a folder for the CSVs, plots and report.md"
    return None


def handle(args: argparse.Namespace) -> int:
    """Analyse `args.path`; print the summary and write outputs where asked."""
    # numpy's BLAS threads would make every fork unsafe; the analysis multiplies no large matrices.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from analysis import parallel

    with parallel.Helpers() as helpers:
        if args.scheduler is None:  # else the Dask workers read the trace
            helpers.begin_reading(args.path)  # before pandas and the analysis are imported (0.3 s)
        return _handle(args, helpers)


def _writes_files(args: argparse.Namespace) -> bool:
    """Whether the command will likely write its folder of files (PNGs among them): --out, or a path
    in a run directory or a job. A wrong guess costs only the helper's work on another core."""
    if args.out:
        return True
    path = Path(args.path).absolute()
    if path.is_dir() and next(path.glob("worker-*"), None) is not None:
        return True
    return any((folder / "run.json").is_file() for folder in (path, *path.parents))


def _handle(args: argparse.Namespace, helpers: Helpers) -> int:
    from analysis import pipeline
    from analysis.read.trace import TraceError
    from analysis.render import outputs

    path = Path(args.path)
    if args.step_name is not None:
        from analysis.worker import check_step_name

        try:
            check_step_name(args.step_name)
        except ValueError as exc:  # not a pattern, or one whose match can take exponential time
            return error("--step-name" + str(exc).removeprefix("step_name"))
    limits = {}
    if args.fail_on is not None:
        from analysis.comparison.gate import parse_limits

        try:
            limits = parse_limits(args.fail_on)
        except ValueError as exc:
            return error(f"--fail-on: {exc}")
    try:
        with file_warnings():  # a --peak-file entry that is skipped: a `warning:` line, not Python's own format
            peak = _ceilings(args)
    except ValueError as exc:
        return error(str(exc))
    if args.scheduler is not None:
        from analysis.executors import SchedulerError, check_address

        try:
            check_address(args.scheduler)
        except SchedulerError as exc:
            return error(f"--scheduler {exc}")
    if args.output:
        try:
            args.format = format_of_output(args.output, "analysis", args.format)
        except ValueError as exc:
            return error(str(exc))
    default_out = path / "analysis" if (path / "run.json").is_file() and (path / "steps.csv").is_file() else None
    problem = (
        perfetto_option.usage_error(args)
        or output_file_problem("-o", args.output, "report.html")
        or _out_dir_problem(args.out)
        or outputs_problem(
            [path], {"-o": args.output, "--perfetto": args.perfetto}, Path(args.out) if args.out else default_out
        )
    )
    if problem is not None:
        return error(problem)
    if not path.exists():
        if path.is_symlink():  # exists() follows the link: a loop or a missing target reads as no file
            return error(
                f"{path} is a link that leads nowhere (to {os.readlink(path)}: a loop of links or a missing target)"
            )
        return error(f"no such file or directory: {path}", hint="pass a run directory, log folder or .xplane.pb file")
    kept = None  # the analysed worker's files, for the Perfetto trace
    if _writes_files(args):
        # Loaded once, shared with the plot helper forked here, rather than in both.
        import analysis.pipeline  # noqa: F401
        from analysis.render import plots  # noqa: F401

        helpers.start_plots()
    try:
        with file_warnings():
            if args.scheduler is not None:
                from analysis.executors import LostWorkers, SchedulerError, dask_executor

                try:
                    # The Dask workers read the files at this machine's absolute path, not in their own folder.
                    with dask_executor(args.scheduler, paths=[path.absolute()]) as executor:
                        result, _ = pipeline.analyzed(
                            path, args.step_name, executor=executor, peak=peak, helpers=helpers
                        )
                except SchedulerError as exc:
                    return error(str(exc), code=EXIT_FAILURE if isinstance(exc, LostWorkers) else EXIT_USAGE)
            else:  # with --perfetto, the trace's events are drawn too: kept from the analysis' read
                result, kept = pipeline.analyzed(
                    path, args.step_name, peak=peak, helpers=helpers, keep=args.perfetto is not None
                )
    except TraceError as exc:
        return error(str(exc), code=EXIT_FAILURE)
    except (OSError, ValueError) as exc:
        return error(f"cannot analyse {path}: {exc}", code=EXIT_FAILURE)

    output = Path(args.output) if args.output else None
    if args.format is None:
        args.format = format_for_path(output, "analysis") if output is not None else "text"
    # The analysis first: a folder that cannot be written (read-only, full disk) loses only the files.
    text = result.render(args.format)
    if output is not None:
        from analysis.render.outputs import write_text_atomically

        try:
            output.parent.mkdir(exist_ok=True)  # the last folder only, as mkdir: a mistyped path is an error
            write_text_atomically(output, text, named=True)
        except OSError as exc:
            return error(f"cannot write {output}: {exc.strerror or exc}", code=EXIT_FAILURE)
        print(f"wrote {output}", file=sys.stderr)
    else:
        problem = write_stdout(text)
        if problem is not None:
            return error(f"cannot write the analysis to stdout: {problem}", code=EXIT_FAILURE)
    failed = None
    if args.perfetto is not None:  # before the files: the trace's events are let go before the plots are drawn
        failed = perfetto_option.write(args, result, kept)
        kept = None
    out_dir = Path(args.out) if args.out else result.out_dir
    if out_dir is not None:
        try:
            helpers.core_free()
            written = outputs.write_outputs(result, out_dir, helpers.draw)
        except OSError as exc:
            return error(
                f"cannot write the output files to {out_dir}: {exc.strerror or exc}",
                hint="the analysis is printed above; pass --out DIR to write them to a folder you can write to",
                code=EXIT_FAILURE,
            )
        if args.format == "text" and written:
            print(f"wrote {len(written)} files to {out_dir}", file=sys.stderr if output is not None else sys.stdout)
    if failed is not None:
        return failed
    if limits:
        from analysis.comparison.gate import over_limits

        crossed = over_limits(result.mean, limits)
        if crossed:
            print(f"regression: {'; '.join(crossed)} (--fail-on {args.fail_on})", file=sys.stderr)
            return EXIT_REGRESSION
    return EXIT_OK
