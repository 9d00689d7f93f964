"""TensorBoard on loopback over the runs folder (`devprof tensorboard` serves it until Ctrl-C)."""

from __future__ import annotations

import contextlib
import io
import logging
import sys


def launch(logdir: str, port: int = 0):
    """Start TensorBoard in this process on 127.0.0.1; returns (server, url).

    Loopback only: TensorBoard has no authentication, and traces can show paths and code.
    The console keeps what the user asked for: no line per HTTP request, no start-up notes.
    """
    from profiler import quiet

    quiet.import_tensorflow()  # TensorBoard imports it; without its start-up chatter
    from tensorboard import program

    _quiet_request_logs()
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port),
                          "--reload_interval", "5"])
    if quiet.verbose():
        return board, board.launch()
    notes = io.StringIO()
    with contextlib.redirect_stderr(notes):  # "NOTE: Using experimental fast data loading logic ..."
        url = board.launch()
    advisory = getattr(program, "_DATA_SERVER_ADVISORY_MESSAGE", None)
    rest = notes.getvalue().replace(advisory, "") if advisory else notes.getvalue()
    if rest.strip():
        print(rest.strip(), file=sys.stderr)
    return board, url


def _quiet_request_logs() -> None:
    """XProf's profile plugin writes a JSON line per HTTP request to stderr (for cloud log
    collectors) and werkzeug logs each request: neither belongs on a user's console."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with contextlib.suppress(Exception):
        from xprof import profile_plugin

        if hasattr(profile_plugin, "_logging_wrapper"):
            profile_plugin._logging_wrapper = lambda app, *args, **kwargs: app
