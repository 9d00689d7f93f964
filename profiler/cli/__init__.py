"""The `devprof` command line: one parser, one subcommand module each under `profiler.cli.commands`.

`main(argv=None) -> int` is the only entry point; `program()` runs it as the `devprof` script and
`python -m profiler` do. Conventions shared by every subcommand live in `profiler.cli.common`:
errors are one `error: ...` line on stderr, exit code 2 for bad usage and 1 for a failure,
machine-readable output is `--format json` with a top-level `schema_version`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading

from analysis.render.files import inert
from profiler.cli.commands import COMMANDS
from profiler.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, error
from profiler.device import quiet


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one `error: ...` line (argparse prints the whole usage)."""

    def error(self, message):
        hint = f"see '{self.prog} --help'"
        missing = re.match(r"argument (--[\w-]+)(?:/\S+)?: expected one argument", message)
        if missing:  # also what argparse says of a value that begins with '-', as `--profile-steps -1:2`
            hint = f"a value that begins with '-' is written {missing.group(1)}=VALUE; {hint}"
        error(message, hint=hint)
        raise SystemExit(EXIT_USAGE)


class _Version(argparse.Action):
    """`--version`, reading the package metadata only when asked (importlib.metadata slows every start)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from profiler.record.version import __version__

        parser._print_message(f"devprof {__version__}\n", sys.stdout)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The one `devprof` parser: global options and every subcommand."""
    parser = _Parser(prog="devprof", description="Profile TensorFlow training and say why a device is slow.")
    parser.add_argument("--version", action=_Version, help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


EXIT_BROKEN_PIPE = 141  # as a shell reports a program ended by SIGPIPE


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so Python's flush at exit does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# Commands that only read files and write others: once they have flushed their output, the process
# ends without freeing the analysis object by object (0.12 s of the 3 s a 1M-event trace takes).
QUICK_EXIT_COMMANDS = frozenset({"analyze", "compare"})


class _InertStream:
    """A console stream that shows the acting characters any input carried as escapes
    (`analysis.render.files.inert`); devprof's own "erase the line" of a progress line still acts."""

    ERASE_LINE = "\x1b[K"

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(self.ERASE_LINE.join(inert(part) for part in text.split(self.ERASE_LINE)))
        return len(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _console_shows_what_it_can() -> None:
    """A console whose encoding cannot show a character (PYTHONIOENCODING=ascii, a latin-1 terminal) gets
    a replacement for it, not an error that loses the whole report."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):
                pass


def program() -> None:
    """`devprof` as a program: `main()` on the process's arguments, then the process's exit."""
    _console_shows_what_it_can()
    if sys.stdout is not None:
        sys.stdout = _InertStream(sys.stdout)
    if sys.stderr is not None:
        sys.stderr = _InertStream(sys.stderr)
    command: list[str] = []
    code = main(ran=command)
    if command and command[0] in QUICK_EXIT_COMMANDS and threading.active_count() == 1:
        try:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:  # None: the program was started with the stream closed (`>&-`)
                    stream.flush()
        except (OSError, ValueError):
            sys.exit(code)  # the usual exit reports it as before
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None, ran: list[str] | None = None) -> int:
    """Run `devprof` with `argv` (default: the process's arguments); returns the exit code. `ran`
    (a list) gets the name of the command that ran."""
    # TensorFlow's C++ INFO/WARNING lines would bury the progress output; commands that
    # start TensorFlow do it through `quiet.import_tensorflow`, which holds the lines it prints
    # before its log is set up to the same level (TF_CPP_MIN_LOG_LEVEL=0 or DEVPROF_DEBUG=1
    # show them all).
    quiet.configure()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and --version (0), or a usage error already reported (2)
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    if ran is not None:
        ran.append(args.command)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `devprof analyze ... | head`: the reader has all it wanted
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # noqa: BLE001 - a bug still gets one line; DEVPROF_DEBUG=1 shows the traceback
        if quiet.debug():
            raise
        first = str(exc).strip().splitlines()
        return error(
            f"{args.command} failed: {type(exc).__name__}: {first[0] if first else 'no detail'}",
            hint="set DEVPROF_DEBUG=1 for the traceback",
            code=EXIT_FAILURE,
        )
