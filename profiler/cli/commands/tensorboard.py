"""`devprof tensorboard`: TensorBoard on 127.0.0.1 over the runs folder, until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import threading

from profiler.cli.common import EXIT_FAILURE, EXIT_OK, error

MAX_PORT = 65535


def add_parser(sub) -> argparse.ArgumentParser:
    board = sub.add_parser(
        "tensorboard",
        help="start TensorBoard on 127.0.0.1 over the runs",
        description="Serve TensorBoard (scalars and the Profile tab) on 127.0.0.1 only: it has no authentication.",
    )
    board.add_argument("logdir", nargs="?", default="runs", help="folder of run directories (default: runs)")
    board.add_argument("--port", type=int, default=6006, help="port to listen on; 0 picks a free port (default: 6006)")
    board.set_defaults(handler=handle)
    return board


def handle(args: argparse.Namespace) -> int:
    from profiler.cli import tensorboard_server
    from profiler.device import quiet

    if not 0 <= args.port <= MAX_PORT:  # a usage error, before TensorBoard is started to find it out
        return error(f"--port must be a port number from 1 to {MAX_PORT}, or 0 for a free one (got {args.port})")
    if os.path.exists(args.logdir) and not os.path.isdir(args.logdir):
        return error(f"{args.logdir!r} is a file, not a folder", hint="pass the folder that holds the run directories")
    if not os.path.isdir(args.logdir):
        return error(f"no such folder {args.logdir!r}", hint="run 'devprof run' first, or pass the runs folder")
    with quiet.filtered_stderr_stream(tensorboard_server.XPROF_NOISE):
        try:
            _, url = tensorboard_server.launch(args.logdir, args.port)
        except Exception as exc:  # noqa: BLE001 - e.g. the port is taken
            first = str(exc).strip().splitlines()
            return error(
                f"TensorBoard did not start on port {args.port}: {first[0] if first else type(exc).__name__}",
                hint="try --port 0 for a free port",
                code=EXIT_FAILURE,
            )
        print(f"TensorBoard at {url} (scalars and the Profile tab; Ctrl-C to stop)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return EXIT_OK
