"""`devprof run` options that cannot work are usage errors before anything is written: one
`error:` line naming the option, exit code 2, no traceback, no run folder anywhere."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from cli_checks import TINY_RUN, one_usage_error
from profiler import cli
from profiler.record import rundir
from profiler.train.config import RunConfig, UsageError


def run_usage_error(capsys, out, *args: str) -> str:
    """`devprof run` that must stop with a usage error; returns its one `error:` line."""
    code = cli.main(
        [
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
            "--out",
            str(out),
            *args,
        ]
    )
    return one_usage_error(code, capsys)


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []


# ---------------------------------------------------------------- --run-name is one folder name


@pytest.mark.parametrize(
    "name, expect",
    [
        ("../escaped", "'/'"),
        ("{tmp}/absolute", "'/'"),
        ("a/b", "'/'"),
        ("..", "cannot be '..'"),
        (".", "cannot be '.'"),
        ("", "cannot be empty"),
        ("x" * 256, "at most 255"),
        ("é" * 128, "256 bytes"),  # 128 characters, 256 bytes in UTF-8
    ],
    ids=["parent", "absolute", "nested", "dotdot", "dot", "empty", "long", "long-bytes"],
)
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


@pytest.mark.parametrize(
    "option, minimum",
    [
        ("--sample-interval", "0.05"),
        ("--inject-input-delay-ms", "0"),
        ("--inject-host-delay-ms", "0"),
    ],
)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_float_options_must_be_finite(tmp_path, capsys, option, minimum, value):
    out = tmp_path / "runs"
    line = run_usage_error(capsys, out, f"{option}={value}")
    assert line.startswith(f"error: {option} must be a finite number >= {minimum}"), line
    assert "cannot be negative" not in line and "cost more" not in line
    assert not out.exists()


@pytest.mark.parametrize(
    "option, value, expect",
    [
        (
            "--sample-interval",
            "0.01",
            "--sample-interval must be at least 0.05 s (got 0.01): shorter intervals cost more than they show",
        ),
        ("--inject-input-delay-ms", "-1", "--inject-input-delay-ms must be at least 0 (got -1.0)"),
        ("--inject-host-delay-ms", "-0.5", "--inject-host-delay-ms must be at least 0 (got -0.5)"),
    ],
)
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
    real_mkstemp: Callable[..., tuple[int, str]] = tempfile.mkstemp

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


# ---------------------------------------------------------------- --run-name control characters


@pytest.mark.parametrize(
    "name", ["a\nb", "a\rb", "tab\there", "bell\x07", "del\x7f", "nel\x85", "line\u2028sep", "=1+2\n"]
)
def test_run_name_with_control_characters_is_refused(tmp_path, capsys, name):
    out = tmp_path / "runs"
    line = one_usage_error(cli.main([*TINY_RUN, "--out", str(out), "--run-name", name]), capsys)
    assert "--run-name" in line and "control character" in line, line
    assert "\n" not in line and "\r" not in line  # the name is shown escaped, on one line
    assert files_under(tmp_path) == []


def test_printable_names_stay_allowed():
    for name in ("=1+2", "run|a", "é-ü", "a b", "日本"):
        RunConfig(run_name=name).validate()
    with pytest.raises(UsageError, match="control character U\\+000A"):
        RunConfig(run_name="a\nb").validate()


# ---------------------------------------------------------------- environment variables


def test_a_bad_environment_variable_stops_a_single_run_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DEVPROF_CLUSTER_WAIT_S", "-1")
    with pytest.raises(UsageError, match="DEVPROF_CLUSTER_WAIT_S"):
        RunConfig(out=str(tmp_path)).validate()
    monkeypatch.setenv("DEVPROF_CLUSTER_WAIT_S", "2.5")
    RunConfig(out=str(tmp_path)).validate()
    assert files_under(tmp_path) == []


def profiled_run_usage_error(capsys, out, *args: str) -> str:
    code = cli.main(
        [
            "run",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--limit-images",
            "64",
            "--epochs",
            "1",
            "--quiet",
            "--no-sample",
            "--out",
            str(out),
            *args,
        ]
    )
    return one_usage_error(code, capsys)


# ---------------------------------------------------------------- --seed and the profiler window's options


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999"])
def test_a_seed_outside_32_bits_is_a_usage_error_before_anything_is_written(tmp_path, capsys, seed):
    """Was `error: training failed: ValueError: expected non-negative integer`, exit 1, with a failed run
    directory left behind (Keras, NumPy and tf.data take 32-bit seeds)."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", "--seed", seed)
    assert line == f"error: --seed must be a whole number from 0 to 4294967295 (got {seed})"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "option, says",
    [
        (["--profile-steps", "1:2"], "--profile-steps 1:2 sets the traced window"),
        (["--python-tracer"], "--python-tracer traces Python calls"),
    ],
)
def test_profiler_window_options_with_no_profile_are_a_usage_error(tmp_path, capsys, option, says):
    """`--no-profile --profile-steps 1:2` ran without a trace and without a word about the window asked for."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", "--no-profile", *option)
    assert says in line and "--no-profile traces none" in line
    assert not (tmp_path / "runs").exists()


def test_the_largest_32_bit_seed_is_taken(tmp_path):
    from models.training import TrainConfig
    from profiler.train.config import MAX_SEED, RunConfig, UsageError

    RunConfig(out=str(tmp_path), train=TrainConfig(seed=MAX_SEED), profile=False).validate()
    with pytest.raises(UsageError, match="--seed"):
        RunConfig(out=str(tmp_path), train=TrainConfig(seed=MAX_SEED + 1)).validate()


# ---------------------------------------------------------------- injected delays and sample intervals that cannot work


@pytest.mark.parametrize("option", ["--inject-input-delay-ms", "--inject-host-delay-ms"])
@pytest.mark.parametrize("value", ["1e9", "60001"])
def test_an_injected_delay_beyond_a_minute_a_step_is_a_usage_error(tmp_path, capsys, option, value):
    """Was accepted: 1e9 ms slept in every step is a run that never ends."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", option, value)
    assert line == f"error: {option} must be at most 60000 (a minute in every step; got {float(value):g})"
    assert not (tmp_path / "runs").exists()


def test_a_sample_interval_with_no_sampling_is_a_usage_error(tmp_path, capsys):
    """Was ignored in silence: --no-sample runs no sampler, so an interval says nothing."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", "--sample-interval", "0.2")
    assert line == (
        "error: --sample-interval 0.2 sets how often the samplers sample and --no-sample runs none: "
        "leave one of them out"
    )
    assert not (tmp_path / "runs").exists()
