"""Checks shared by CLI tests."""

from __future__ import annotations


def one_usage_error(code: int, capsys) -> str:
    """Exit code 2 with exactly one `error:` line on stderr and no traceback; returns that line."""
    captured = capsys.readouterr()
    assert code == 2, (code, captured.err)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]
