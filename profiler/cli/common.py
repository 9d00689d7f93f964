"""What every `devprof` subcommand shares: exit codes, `error:`/`warning:` lines, the `--format`
option, old option spellings that still work, options as data, and the tracer options.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.render.files import is_stream

EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and failed (training crashed, nothing to analyse, ...)
EXIT_USAGE = 2  # bad options or input: a missing path, an unknown device, an existing run name
EXIT_REGRESSION = 3  # a gate crossed: --fail-if-slower, --fail-on
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_TERMINATED = 143  # SIGTERM (kill, Docker, Kubernetes, Slurm), as a shell reports it


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` only where it says something: not for on/off switches (`--no-profile`'s
    `True` read as 'profiling off by default'), not for an unset default, not where the help
    already gives the default in words."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.nargs == 0 or "default" in text or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def error(message: str, hint: str | None = None, code: int = EXIT_USAGE) -> int:
    """Print `error: <message> (<hint>)` on stderr and return `code`, the exit code."""
    print(f"error: {message}" + (f" ({hint})" if hint else ""), file=sys.stderr)
    return code


def warn(message: str) -> None:
    """Print `warning: <message>` on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def output_file_problem(option: str, path: str | None, example: str) -> str | None:
    """Why `path` cannot be the file `option` (-o) names, before anything is read: a folder (was found out
    only after the whole analysis, exit 1), or None."""
    if path is not None and os.path.isdir(path):
        return f"{option} {path}: is a folder; name the file, e.g. {os.path.join(path, example)}"
    return None


# What devprof reads in a run directory or log folder: an output must never replace one of them.
INPUT_FILE_NAMES = frozenset({"run.json", "steps.csv", "op_costs.csv", "crash.log", "onednn_verbose.log"})
INPUT_FOLDERS = frozenset({"utilization", "plugins"})
# What `analyze` writes into its --out folder (analysis/render/outputs.py).
ANALYSIS_FILES = frozenset(
    {
        "step_breakdown.csv",
        "step_breakdown.png",
        "ops.csv",
        "epoch_breakdown.csv",
        "epoch_breakdown.png",
        "utilization.png",
        "workers.csv",
        "memory.csv",
        "trace_vs_steps.csv",
        "report.md",
        "report.html",
        "analysis.json",
    }
)


def _is_input(output: Path, inputs: list[Path]) -> bool:
    """Whether `output` is a file devprof reads from `inputs`: an input file itself, or a run file,
    trace or sampler CSV inside an input folder."""
    out = output.resolve()
    for given in inputs:
        root = given.resolve()
        if out == root:
            return True
        if root.is_dir() and out.is_relative_to(root):
            inside = out.relative_to(root).parts
            if (
                out.name in INPUT_FILE_NAMES
                or out.name.endswith(".xplane.pb")
                or any(part in INPUT_FOLDERS for part in inside[:-1])
            ):
                return True
    return False


def outputs_problem(
    inputs: list[str | Path],
    files: dict[str, str | None],
    out_dir: Path | None = None,
    out_files: frozenset[str] = ANALYSIS_FILES,
) -> str | None:
    """Why the output files (`{option: path}`) cannot be written, before anything is read: one would
    replace an input, another output, or a file the --out folder gets; else None."""
    named: dict[str, Path] = {}
    for option, given in files.items():
        try:
            if given and not is_stream(Path(given)):
                named[option] = Path(given)
        except OSError as exc:  # a block device: never written
            return f"cannot write {given}: {exc}"
    sources = [Path(p) for p in inputs]
    seen: dict[Path, str] = {}
    for option, path in named.items():
        if _is_input(path, sources):
            return f"{option} {path}: that is a file devprof reads for this analysis; write the output elsewhere"
        resolved = path.resolve()
        if resolved in seen:
            return f"{seen[resolved]} and {option} both name {path}: one output would replace the other"
        seen[resolved] = option
        if out_dir is not None and resolved.parent == out_dir.resolve() and path.name in out_files:
            return f"{option} {path}: the --out folder {out_dir} gets its own {path.name}; name another file"
    return None


def write_stdout(text: str) -> str | None:
    """Write `text` on stdout; why it could not be written (`> file` on a full disk), else None. A reader
    that closed the pipe is the caller's (BrokenPipeError: exit 141, no line)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        try:  # what is still buffered would fail again at exit, as "Exception ignored ..."
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        return exc.strerror or str(exc)
    return None


@contextlib.contextmanager
def file_warnings():
    """Show what the readers skipped in run files as `warning: ...` lines (one per file and problem)."""
    from analysis.read.run_files import RunFileWarning  # here, not at the top: it imports pandas (slow --help)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RunFileWarning)
        try:
            yield
        finally:
            seen = set()
            for item in caught:
                message = str(item.message)
                if issubclass(item.category, RunFileWarning) and message not in seen:
                    seen.add(message)
                    warn(message)


def with_schema(payload: dict) -> dict:
    """`payload` with `schema_version` as its first key."""
    from analysis.read.run_files import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION, **payload}


class DeprecatedAlias(argparse.Action):
    """An old option spelling that still works: it stores into the new option's `dest` and warns.

    `add_argument("--json", action=DeprecatedAlias, dest="format", const="json", nargs=0,
    message="--json is deprecated; use --format json")` makes `--json` mean `--format json`;
    with a value (`nargs=None`) the alias takes the value the new option would.
    """

    def __init__(self, option_strings, dest, message: str, nargs=None, const=None, **kwargs):
        self.message = message
        kwargs.setdefault("default", argparse.SUPPRESS)  # the new option's default stands
        super().__init__(option_strings, dest, nargs=nargs, const=const, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        warn(self.message)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_format_option(
    parser: argparse.ArgumentParser, choices: tuple[str, ...], help: str, json_alias: bool = False
) -> None:
    """`--format {choices}` (default: the first); `json_alias` keeps the old `--json` working."""
    parser.add_argument("--format", choices=choices, default=choices[0], help=f"{help} (default: {choices[0]})")
    if json_alias:
        parser.add_argument(
            "--json",
            action=DeprecatedAlias,
            dest="format",
            nargs=0,
            const="json",
            message="--json is deprecated; use --format json",
            help="deprecated spelling of --format json",
        )


@dataclass(frozen=True)
class Option:
    """One option as data, so that what passes options on to another process (`run --workers` to its
    workers) reads the same table argparse is built from, not argparse's internals."""

    flag: str
    dest: str
    default: Any
    takes_value: bool  # False: a switch, given or not
    per_worker: bool  # set by `run --workers` for each worker, or its own: never passed on as given
    keywords: dict[str, Any]  # the rest of what `add_argument` takes: help, type, choices, metavar, action

    def add_to(self, parser) -> None:
        parser.add_argument(self.flag, dest=self.dest, default=self.default, **self.keywords)


def option(flag: str, *, per_worker: bool = False, **keywords: Any) -> Option:
    """The `Option` that `add_argument(flag, **keywords)` adds."""
    dest = keywords.pop("dest", flag.lstrip("-").replace("-", "_"))
    switch_default = {"store_true": False, "store_false": True}.get(keywords.get("action", ""))
    default = keywords.pop("default", switch_default)
    return Option(flag, dest, default, switch_default is None, per_worker, keywords)


# The profiler's tracer options, the same for `devprof run` and `devprof capture`.
TRACER_OPTIONS = (
    option(
        "--host-tracer-level",
        type=int,
        choices=[0, 1, 2, 3],
        default=2,
        help="host trace detail: 0 off, 1 user annotations only, 2 also TensorFlow ops, 3 verbose",
    ),
    option(
        "--device-tracer-level",
        type=int,
        choices=[0, 1],
        default=1,
        help="device (GPU/TPU) kernels and copies: 0 off, 1 on",
    ),
    option("--python-tracer", action="store_true", help="trace Python calls (python_tracer_level=1; large traces)"),
)


def add_tracer_options(parser) -> None:
    """The profiler's tracer options, the same for `devprof run` and `devprof capture`."""
    for each in TRACER_OPTIONS:
        each.add_to(parser)


def tracer_options(args: argparse.Namespace):
    """The `tracing.TracerOptions` the tracer options asked for."""
    from profiler.record import tracing

    return tracing.TracerOptions(args.host_tracer_level, args.device_tracer_level, int(args.python_tracer))
