"""Checks shared by CLI tests: one usage error, `devprof` called in-process within a time limit, nothing
written under a folder."""

from __future__ import annotations

import threading
from pathlib import Path

from profiler import cli


def one_usage_error(code: int, capsys) -> str:
    """Exit code 2 with exactly one `error:` line on stderr and no traceback; returns that line."""
    captured = capsys.readouterr()
    assert code == 2, (code, captured.err)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


HANG_LIMIT_S = 60  # far above what a call takes here (under a second): only a hang reaches it


def finishes(call, *args):
    """`call(*args)` in a thread; fails instead of hanging when it does not return in time."""
    result: dict = {}

    def target():
        try:
            result["value"] = call(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_LIMIT_S)
    assert not thread.is_alive(), f"{call.__name__}{args} did not return in {HANG_LIMIT_S} s: it hangs"
    if "error" in result:
        raise result["error"]
    return result["value"]


def devprof(capsys, *argv) -> tuple[int, str, str]:
    code = finishes(cli.main, [str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


TINY_RUN = [
    "run",
    "--device",
    "cpu",
    "--data",
    "synthetic",
    "--limit-images",
    "100",
    "--epochs",
    "1",
    "--quiet",
    "--no-profile",
    "--no-sample",
]


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []
