"""Signals in child processes the tests start."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """In a child before it starts: SIGINT does what it does in a terminal. Tests started in the
    background (`nohup`, `&` in a script) pass SIGINT on ignored, and a Python started so never
    raises KeyboardInterrupt: the job would train on through the Ctrl-C a test sends it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
