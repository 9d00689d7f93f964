"""`devprof mcp [--root FOLDER ...]`: devprof's analysis as MCP tools for agents, over stdio.

The server (`profiler.cli.mcp_server`) reads runs under the given roots only and writes nothing. It
needs the official MCP SDK (`pip install 'devprof[mcp]'`); without it, or with a root that is not a
folder, the command prints one `error:` line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util

from profiler.cli.common import EXIT_OK, error


def add_parser(sub) -> argparse.ArgumentParser:
    mcp = sub.add_parser(
        "mcp",
        help="serve devprof's analysis to agents (MCP, over stdio)",
        description="Serve devprof's analysis as Model Context Protocol tools over stdio: "
        "list_runs, analyze (the summary), findings, ops, steps, compare, explain_rule. "
        "Read-only; paths outside the roots are refused. "
        "Needs pip install -e '.[mcp]'.",
    )
    mcp.add_argument(
        "--root",
        action="append",
        default=None,
        metavar="FOLDER",
        help="a folder whose runs the tools may read (repeatable; default: the current folder)",
    )
    mcp.set_defaults(handler=handle)
    return mcp


def handle(args: argparse.Namespace) -> int:
    from profiler.cli import mcp_server

    try:
        roots = mcp_server.Roots(args.root or ["."])
    except ValueError as exc:
        return error(str(exc))
    if importlib.util.find_spec("mcp") is None:
        return error("devprof mcp needs the MCP SDK, which is not installed", hint="pip install -e '.[mcp]'")
    mcp_server.serve(roots)
    return EXIT_OK
