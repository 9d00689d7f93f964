"""`devprof compare RUN...`: seconds per epoch of runs side by side, with the reason for every gap.

Calls one analysis entry point (`analysis.comparison.compare_paths`) and renders its `Comparison`. Bad
input (not a run directory, a run without epochs, a malformed external CSV, an unknown
baseline) prints one `error: ...` line and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from analysis.render import format_for_path, format_of_output, formats_for
from analysis.render.files import is_stream
from profiler.cli.commands import perfetto_option
from profiler.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_REGRESSION,
    DeprecatedAlias,
    add_format_option,
    error,
    file_warnings,
    output_file_problem,
    outputs_problem,
    write_stdout,
)


def add_parser(sub) -> argparse.ArgumentParser:
    compare = sub.add_parser(
        "compare",
        help="seconds per epoch of runs side by side, with the reason for every gap",
        description="Seconds per epoch of several runs side by side, with the reason for every gap.",
    )
    compare.add_argument("runs", nargs="*", metavar="RUN", help="run directories written by 'devprof run'")
    compare.add_argument(
        "--external",
        action="append",
        default=[],
        metavar="CSV",
        help="timings measured elsewhere: device,seconds_per_epoch[,batch_size,images,notes] "
        "(repeatable; e.g. examples/seed_table.csv)",
    )
    compare.add_argument(
        "--baseline",
        default=None,
        metavar="RUN",
        help="run name, run path or device to compare against (default: the slowest)",
    )
    add_format_option(
        compare, formats_for("comparison"), "output format; with --output, from its extension (.md, .json, .csv, .html)"
    )
    compare.set_defaults(format=None)
    compare.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help="write the output here instead of stdout (and the chart beside it as .png)",
    )
    compare.add_argument(
        "--out",
        dest="output",
        metavar="FILE",
        action=DeprecatedAlias,
        message="--out is deprecated for compare; use --output (-o)",
        help="deprecated spelling of --output",
    )
    compare.add_argument(
        "--ops",
        action="store_true",
        help="with two runs A B: how much of the step-time gap each op explains (B against A)",
    )
    compare.add_argument(
        "--fail-if-slower",
        type=float,
        default=None,
        metavar="PCT",
        help=f"exit {EXIT_REGRESSION} when a run's median steady step (per image if batch sizes "
        "differ) is more than PCT %% slower than the baseline (--baseline, else the first RUN)",
    )
    compare.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="write the seconds-per-epoch bar chart here (default: <output>.png when --output is given)",
    )
    perfetto_option.add_options(compare)
    compare.set_defaults(handler=handle)
    return compare


def handle(args: argparse.Namespace) -> int:
    from analysis import comparison as compare

    if not args.runs and not args.external:
        return error(
            "nothing to compare: pass run directories and/or --external CSV", hint="see 'devprof compare --help'"
        )
    if args.ops and len(args.runs) != 2:
        return error(f"--ops compares two runs, A and B; got {len(args.runs)}", hint="devprof compare A B --ops")
    if args.fail_if_slower is not None and not (args.fail_if_slower >= 0 and args.fail_if_slower < float("inf")):
        return error(f"--fail-if-slower must be a finite percentage >= 0, got {args.fail_if_slower:g}")
    if args.output:
        try:
            args.format = format_of_output(args.output, "comparison", args.format)
        except ValueError as exc:
            return error(str(exc))
    problem = (
        perfetto_option.usage_error(args)
        or output_file_problem("-o", args.output, "compare.txt")
        or outputs_problem(
            [*args.runs, *(args.external or [])], {"-o": args.output, "--plot": args.plot, "--perfetto": args.perfetto}
        )
    )
    if problem is not None:
        return error(problem)
    try:
        with file_warnings():
            result = compare.compare_paths(args.runs, args.external, args.baseline, ops=args.ops)
            table = result.table
            regressions = []
            if args.fail_if_slower is not None:
                first = 0 if args.baseline is None else int(table.index[table["baseline"]][0])
                regressions = compare.slower_than_baseline(table, first, args.fail_if_slower)
    except compare.CompareError as exc:
        return error(str(exc))

    output = Path(args.output) if args.output else None
    if args.format is None:
        args.format = format_for_path(output, "comparison") if output is not None else "text"
    try:
        # beside a file, not beside /dev/null or a pipe (no /dev/null.png)
        plot = (
            Path(args.plot)
            if args.plot
            else (output.with_suffix(".png") if output is not None and not is_stream(output) else None)
        )
        if plot is not None and plot.suffix.lower() not in ("", ".png") and not is_stream(plot):
            return error(f"--plot {plot}: the chart is a PNG; name it {plot.with_suffix('.png')}")
    except OSError as exc:
        return error(f"cannot write {args.plot or args.output}: {exc}")
    if plot is not None:
        try:
            plot.parent.mkdir(exist_ok=True)
            compare.plot_compare(table, plot, named=True)
        except OSError as exc:
            return error(f"cannot write the chart to {plot}: {exc}")
    text = dataclasses.replace(result, plot_name=plot.name if plot is not None else None).render(args.format)
    if output is not None:
        try:
            from analysis.render.outputs import write_text_atomically

            output.parent.mkdir(exist_ok=True)  # the last folder only, as mkdir: a mistyped path is an error
            write_text_atomically(output, text, named=True)
        except OSError as exc:
            return error(f"cannot write {output}: {exc}")
        print(f"wrote {output}" + (f" and {plot}" if plot is not None else ""), file=sys.stderr)
    else:
        problem = write_stdout(text)
        if problem is not None:
            return error(f"cannot write the comparison to stdout: {problem}", code=EXIT_FAILURE)
    if args.format in ("json", "csv") or output is not None:
        for line in compare.warnings(table):  # text and markdown carry them already
            print(line, file=sys.stderr)
    if args.perfetto is not None:
        failed = perfetto_option.write(args, result)
        if failed is not None:
            return failed
    if regressions:
        print(f"regression: {'; '.join(regressions)}", file=sys.stderr)
        return EXIT_REGRESSION
    return EXIT_OK
