"""The console shows what the user asked for: no TensorFlow start-up chatter (absl's I0000/W0000
lines, cuInit's complaint on a machine without a GPU driver), no gRPC dump when a capture fails,
and still everything with DEVPROF_DEBUG=1 or TF_CPP_MIN_LOG_LEVEL=0. Real subprocesses where the
chatter is written by C++ straight to file descriptor 2; in-process for the settings themselves
(DEVPROF_DEBUG's values, a TF_CPP_MIN_LOG_LEVEL that is no number, TensorFlow's Python warnings)."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys

import pytest

from profiler.device import quiet
from repo_paths import REPO

NATIVE_LINE = re.compile(r"^[IWEF]\d{4} ")


def devprof(*argv, **env):
    """`devprof ARGV` as a user starts it: no log level or debug switch unless given."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "DEVPROF_DEBUG")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "profiler", *map(str, argv)],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def chatter(stderr: str) -> list[str]:
    return [
        line
        for line in stderr.splitlines()
        if NATIVE_LINE.match(line) or "cuInit" in line or "absl::InitializeLog" in line
    ]


@pytest.mark.slow
def test_devices_prints_no_native_chatter():
    done = devprof("devices")
    assert done.returncode == 0, done.stderr
    assert chatter(done.stderr) == [], done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("cpu: ")


@pytest.mark.slow
def test_a_run_prints_no_native_chatter(tmp_path):
    done = devprof(
        "run",
        "--data",
        "synthetic",
        "--limit-images",
        "200",
        "--epochs",
        "1",
        "--quiet",
        "--no-sample",
        "--out",
        tmp_path,
        "--run-name",
        "r",
    )
    assert done.returncode == 0, done.stderr
    assert chatter(done.stderr) == [], done.stderr
    assert done.stderr == ""


@pytest.mark.slow
def test_everything_shows_when_asked_for():
    shown = devprof("devices", TF_CPP_MIN_LOG_LEVEL="0")
    assert shown.returncode == 0
    assert any(NATIVE_LINE.match(line) for line in shown.stderr.splitlines()), shown.stderr
    debug = devprof("devices", DEVPROF_DEBUG="1")
    assert debug.returncode == 0
    assert "absl::InitializeLog" in debug.stderr or NATIVE_LINE.search(debug.stderr), debug.stderr


@pytest.mark.slow
def test_capture_from_nothing_is_one_error_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = devprof("capture", f"grpc://localhost:{port}", "--duration-ms", "100", "--out", tmp_path)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"capture from grpc://localhost:{port} failed" in errors[0], done.stderr
    assert "Connection refused" in errors[0] and "--profiler-port" in errors[0]
    assert done.stderr.splitlines() == [f"capturing 100 ms from grpc://localhost:{port} ...", errors[0]], done.stderr
    assert done.stdout == ""  # no "Remaining attempt(s)", no "--num_tracing_attempts" tip
    assert "num_tracing_attempts" not in done.stdout + done.stderr
    assert chatter(done.stderr) == []


@pytest.mark.parametrize(
    "line, hidden_at",
    [
        ("I0000 00:00:1795386464.557924   13046 port.cc:153] oneDNN custom operations are on.", 1),
        ("W0000 00:00:1795386464.557924   13046 some.cc:12] a warning", 2),
        (
            "E0000 00:00:1795386470.065434   13139 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
            "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
            2,
        ),
        (
            "E0000 00:00:1795483744.327150   24668 util.cc:131] oneDNN supports DT_BFLOAT16 only on platforms with "
            "AVX-512. Falling back to the default Eigen-based implementation if present.",
            2,
        ),
        ("E0000 00:00:1795386470.065434   13139 op_kernel.cc:1857] OP_REQUIRES failed: out of memory", 3),
        ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", 1),
    ],
)
def test_native_lines_follow_the_log_level(line, hidden_at):
    for level in range(4):
        assert quiet.is_noise(line, level) == (level >= hidden_at), (level, line)


@pytest.mark.parametrize(
    "line",
    [
        "error: something broke",
        "Traceback (most recent call last):",
        "Segmentation fault",
        "warning: profiler did not start",
    ],
)
def test_other_lines_always_pass(line):
    assert not any(quiet.is_noise(line, level) for level in range(4))


def test_the_default_level_keeps_real_errors():
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", environ)
        quiet.configure()
        assert environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
        assert not quiet.is_noise("E0000 00:00:1.5   1 dso_loader.cc:1] could not load libcudnn")
        environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        quiet.configure()  # the user's choice stands
        assert environ["TF_CPP_MIN_LOG_LEVEL"] == "0" and quiet.verbose()


# ---------------------------------------------------------------- DEVPROF_DEBUG


@pytest.mark.parametrize(
    "value, on",
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("Yes", True),
        (" 1 ", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("", False),
        ("off", False),
        ("2", False),
    ],
)
def test_only_1_true_or_yes_turn_debugging_on(monkeypatch, value, on):
    monkeypatch.setenv("DEVPROF_DEBUG", value)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    assert quiet.debug() is on and quiet.verbose() is on


# ---------------------------------------------------------------- TF_CPP_MIN_LOG_LEVEL and TensorFlow's Python warnings


@pytest.mark.parametrize("value, warned", [("abc", True), ("", False), ("1", False), (" 3 ", False)])
def test_a_tf_log_level_that_is_no_number_is_replaced_with_a_warning(monkeypatch, capsys, value, warned):
    """TensorFlow reads 'abc' as 0 and printed every INFO line of its C++ log; devprof's filter read it as 2."""
    from profiler.device import quiet

    monkeypatch.setenv(quiet.LOG_LEVEL_VAR, value)
    quiet.configure()
    err = capsys.readouterr().err
    assert ("warning: TF_CPP_MIN_LOG_LEVEL='abc' is not a log level" in err) is warned
    expected = value if value.strip() else quiet.DEFAULT_LOG_LEVEL
    assert os.environ[quiet.LOG_LEVEL_VAR] == (quiet.DEFAULT_LOG_LEVEL if warned else expected)


def test_tensorflows_python_warnings_are_kept_off_only_inside_the_block(monkeypatch, caplog):
    """`devprof peak` traces one tf.function per size tried: TensorFlow printed its retracing advice."""
    from profiler.device import quiet

    monkeypatch.delenv(quiet.DEBUG_VAR, raising=False)
    monkeypatch.setenv(quiet.LOG_LEVEL_VAR, "2")
    logger = logging.getLogger("tensorflow")
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        with quiet.tensorflow_python_warnings_off():
            logger.warning("5 out of the last 13 calls triggered tf.function retracing")
        logger.warning("after the block")
        monkeypatch.setenv(quiet.DEBUG_VAR, "1")
        with quiet.tensorflow_python_warnings_off():
            logger.warning("asked for everything")
    assert [record.message for record in caplog.records] == ["after the block", "asked for everything"]
