"""`devprof run` options that cannot work are usage errors before anything is written: one
`error:` line naming the option, exit code 2, no traceback, no run folder anywhere."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from cli_checks import one_usage_error
from profiler import cli
from profiler.record import rundir
from profiler.train.config import RunConfig, UsageError


def run_usage_error(capsys, out, *args: str) -> str:
    """`devprof run` that must stop with a usage error; returns its one `error:` line."""
    code = cli.main(["run", "--device", "cpu", "--data", "synthetic", "--limit-images", "100", "--epochs", "1",
                     "--quiet", "--no-profile", "--no-sample", "--out", str(out), *args])
    return one_usage_error(code, capsys)


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []


# ---------------------------------------------------------------- --run-name is one folder name


@pytest.mark.parametrize("name, expect", [
    ("../escaped", "'/'"),
    ("{tmp}/absolute", "'/'"),
    ("a/b", "'/'"),
    ("..", "cannot be '..'"),
    (".", "cannot be '.'"),
    ("", "cannot be empty"),
    ("x" * 256, "at most 255"),
    ("é" * 128, "256 bytes"),  # 128 characters, 256 bytes in UTF-8
], ids=["parent", "absolute", "nested", "dotdot", "dot", "empty", "long", "long-bytes"])
def test_run_name_must_be_one_folder_name(tmp_path, capsys, name, expect):
    out = tmp_path / "out" / "runs"
    out.mkdir(parents=True)
    line = run_usage_error(capsys, out, "--run-name", name.format(tmp=tmp_path))
    assert "--run-name" in line and expect in line, line
    assert files_under(tmp_path) == [tmp_path / "out", out]  # nothing written, inside --out or beside it


def test_run_name_with_a_nul_character_is_refused():
    # argv cannot carry NUL; the API can.
    with pytest.raises(UsageError, match="NUL"):
        RunConfig(run_name="a\0b").validate()


def test_run_name_of_255_bytes_is_fine():
    RunConfig(run_name="x" * 255).validate()
    RunConfig(run_name="run-1.2_ok").validate()


# ---------------------------------------------------------------- float options are finite numbers


@pytest.mark.parametrize("option, minimum", [
    ("--sample-interval", "0.05"),
    ("--inject-input-delay-ms", "0"),
    ("--inject-host-delay-ms", "0"),
])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_float_options_must_be_finite(tmp_path, capsys, option, minimum, value):
    out = tmp_path / "runs"
    line = run_usage_error(capsys, out, f"{option}={value}")
    assert line.startswith(f"error: {option} must be a finite number >= {minimum}"), line
    assert "cannot be negative" not in line and "cost more" not in line
    assert not out.exists()


@pytest.mark.parametrize("option, value, expect", [
    ("--sample-interval", "0.01", "--sample-interval must be at least 0.05 s (got 0.01): shorter intervals cost more than they show"),
    ("--inject-input-delay-ms", "-1", "--inject-input-delay-ms must be at least 0 (got -1.0)"),
    ("--inject-host-delay-ms", "-0.5", "--inject-host-delay-ms must be at least 0 (got -0.5)"),
])
def test_float_options_below_their_minimum(tmp_path, capsys, option, value, expect):
    assert run_usage_error(capsys, tmp_path / "runs", f"{option}={value}") == f"error: {expect}"


def _options_taking_a_number_with_a_fraction() -> list[str]:
    """The options of `run` whose value is parsed (not a string, not an int) and takes "nan"."""
    import argparse

    parser = cli.build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    found = []
    for action in run._actions:
        if not action.option_strings or action.type in (None, int, str) or action.choices:
            continue
        try:
            action.type("nan")
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        found.append(action.option_strings[0])
    return found


def test_every_float_option_of_run_is_checked(tmp_path, capsys):
    """Every option that reads a number with a fraction refuses NaN and infinity, saying so;
    one added later is found here without being listed."""
    options = _options_taking_a_number_with_a_fraction()
    assert {"--sample-interval", "--inject-input-delay-ms", "--inject-host-delay-ms"} <= set(options)
    for option in options:
        for value in ("nan", "inf"):
            line = run_usage_error(capsys, tmp_path / "runs", f"{option}={value}")
            assert line.startswith(f"error: {option} must be a finite number"), line


# ---------------------------------------------------------------- --out must take a run directory


def test_out_that_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = run_usage_error(capsys, blocker, "--run-name", "r")
    assert line == f"error: --out {blocker}: {blocker} is a file, not a folder"
    line = run_usage_error(capsys, blocker / "sub", "--run-name", "r")
    assert line == f"error: --out {blocker / 'sub'}: {blocker} is a file, not a folder"
    assert blocker.read_text() == "not a folder"
    assert "run.json" not in line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_out_under_proc(capsys):
    line = run_usage_error(capsys, "/proc/devprof-runs", "--run-name", "r")
    assert line.startswith("error: --out /proc/devprof-runs: cannot write in /proc ("), line
    assert "run.json" not in line


def test_out_in_a_read_only_folder(tmp_path, capsys, monkeypatch):
    """A read-only folder (root writes anywhere, so the refusal is what a read-only mount says)."""
    import errno
    import tempfile

    folder = tmp_path / "read-only"
    folder.mkdir()
    real_mkstemp = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == folder:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    line = run_usage_error(capsys, folder / "runs", "--run-name", "r")
    assert line == f"error: --out {folder / 'runs'}: cannot write in {folder} (Read-only file system)"
    assert list(folder.iterdir()) == []


def test_a_writable_out_is_not_created_by_the_check(tmp_path):
    rundir.check_output_folder(tmp_path / "new" / "runs")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- --profiler-port


@pytest.mark.parametrize("port", ["0", "-1", "65536", "70000"])
def test_profiler_port_out_of_range(tmp_path, capsys, port):
    line = run_usage_error(capsys, tmp_path / "runs", "--profiler-port", port)
    assert line == f"error: --profiler-port must be a port number from 1 to 65535 (got {port})"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_busy_profiler_port_is_a_usage_error_before_training(tmp_path, capsys, monkeypatch, host):
    from profiler.record import tracing
    from profiler.train.run import Run

    def never(*args, **kwargs):
        raise AssertionError("training must not start")

    monkeypatch.setattr(Run, "_train", never)
    monkeypatch.setattr(tracing, "start_server", never)
    with socket.socket() as busy:
        busy.bind((host, 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = run_usage_error(capsys, tmp_path / "runs", "--run-name", "r", "--profiler-port", str(port))
    assert line.startswith(f"error: --profiler-port {port} is not free (Address already in use)"), line
    assert not (tmp_path / "runs").exists()


def test_free_profiler_port_passes_the_check():
    from profiler.record import tracing

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tracing.check_port_free(port)  # nothing listens there any more
