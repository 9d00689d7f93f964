"""The `devprof` subcommands, one module each.

Every module has `add_parser(subparsers)`, which adds its subcommand with its options and
sets `handler`, and `handle(args) -> int`, the exit code. `profiler.cli` builds the one
parser from them. Modules import TensorFlow and the analysis code only inside `handle`,
so `devprof analyze` and `devprof --help` start without TensorFlow.
"""

from profiler.cli.commands import analyze, capture, compare, devices, mcp, peak, run, tensorboard, tune

# The order `devprof --help` lists them in.
COMMANDS = (run, tune, devices, capture, tensorboard, analyze, compare, peak, mcp)

__all__ = ["COMMANDS"]
