"""TensorBoard on loopback over the runs folder (`devprof tensorboard` serves it until Ctrl-C)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys


def launch(logdir: str, port: int = 0):
    """Start TensorBoard in this process on 127.0.0.1; returns (server, url).

    Loopback only: TensorBoard has no authentication, and traces can show paths and code.
    The console keeps what the user asked for: no line per HTTP request, no start-up notes.
    """
    from profiler.device import quiet

    quiet.import_tensorflow()  # TensorBoard imports it; without its start-up chatter
    from tensorboard import program

    _quiet_request_logs()
    board = program.TensorBoard()
    board.configure(
        argv=[None, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "5"]
    )
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


# XProf's C++ logs these as errors while it serves the Profile tab as designed.
XPROF_NOISE = (re.compile(r"No (Unified)?ProfileProcessor registered for tool"),)


def _quiet_request_logs() -> None:
    """XProf's profile plugin writes a JSON line per HTTP request to stderr (for cloud log
    collectors), logs its cache work (a missing cache file as an error with a traceback) through
    its own handler, and werkzeug logs each request: none of it belongs on a user's console."""
    from profiler.device import quiet

    if quiet.verbose():
        return
    with contextlib.suppress(Exception):
        from xprof import profile_plugin  # its import sets its logger to INFO, so first

        if hasattr(profile_plugin, "_logging_wrapper"):
            profile_plugin._logging_wrapper = lambda app, *args, **kwargs: app
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # A filter, not a level: each XProf module that loads sets the level back to INFO.
    xprof_log = logging.getLogger("tensorboard.plugins.profile")
    if _only_critical not in xprof_log.filters:
        xprof_log.addFilter(_only_critical)


def _only_critical(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.CRITICAL
