"""Conventions every `devprof` subcommand shares: `--format json` with a `schema_version`, old
spellings that still work with a warning, one meaning per option name, the same tracer
options for `run` and `capture`, the installed version, and help that lists every option."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import cast

import pytest

from cli_checks import files_under, one_usage_error
from marker_traces import hostile_trace
from profiler import cli
from profiler.cli import common
from profiler.device import devices
from profiler.record import tracing
from profiler.roofline import peak
from repo_paths import REPO

SEED_TABLE = REPO / "examples" / "seed_table.csv"
ROWS = [
    {"kind": "cpu", "name": "Test CPU", "cores": 2, "memory_bytes": 2**30},
    {"kind": "gpu", "index": 0, "name": "Fake GPU 0", "compute_capability": "8.0", "memory_bytes": 2**34},
]


def devprof(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.fixture
def fake_devices(monkeypatch):
    monkeypatch.setattr(devices, "describe_devices", lambda backend=None, tpu=None: [dict(r) for r in ROWS])


# ---------------------------------------------------------------- --format json and --json


def test_devices_json_has_a_schema_version(fake_devices, capsys):
    code, out, err = devprof(capsys, "devices", "--format", "json")
    assert code == 0 and err == ""
    assert json.loads(out) == {"schema_version": 1, "devices": ROWS}


def test_devices_json_alias_still_works_with_a_warning(fake_devices, capsys):
    code, out, err = devprof(capsys, "devices", "--json")
    assert code == 0
    assert json.loads(out) == {"schema_version": 1, "devices": ROWS}
    assert err.strip().splitlines() == ["warning: --json is deprecated; use --format json"]


def test_devices_text_is_unchanged(fake_devices, capsys):
    code, out, _ = devprof(capsys, "devices", "--format", "text")
    assert code == 0
    assert out.splitlines() == [
        "cpu: Test CPU (2 logical cores, 1.0 GiB)",
        "gpu0: Fake GPU 0, 16.0 GiB, compute capability 8.0",
    ]


def _cached_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("DEVPROF_CACHE_DIR", str(tmp_path))
    name = devices.cpu_model()
    peak.cache_path(name).write_text(
        json.dumps(
            {
                "format": peak.PEAK_FORMAT_VERSION,
                "device": "cpu",
                "device_name": name,
                "peak_flops_per_second": {"float32": 2.5e11},
                "matmul_flops_per_second": {"float32": 2.5e11},
                "memory_bytes_per_second": 1e10,
            }
        )
    )


@pytest.mark.slow
def test_peak_json_has_a_schema_version_and_json_alias_warns(tmp_path, monkeypatch, capsys):
    _cached_peak(tmp_path, monkeypatch)
    code, out, err = devprof(capsys, "peak", "--format", "json")
    assert code == 0 and err == ""
    shown = json.loads(out)
    assert shown["schema_version"] == 1 and shown["matmul_flops_per_second"] == {"float32": 2.5e11}
    code, out, err = devprof(capsys, "peak", "--json")
    assert code == 0 and json.loads(out) == shown
    assert err.strip().splitlines() == ["warning: --json is deprecated; use --format json"]


# ---------------------------------------------------------------- compare -o/--output


@pytest.mark.parametrize("option", ["-o", "--output"])
def test_compare_output_writes_the_file(tmp_path, capsys, option):
    target = tmp_path / "report" / "compare.md"
    code, out, err = devprof(capsys, "compare", "--external", SEED_TABLE, "--format", "markdown", option, target)
    assert code == 0 and out == ""
    assert target.read_text().startswith("# devprof compare")
    assert target.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {target} and {target.with_suffix('.png')}" in err
    assert "deprecated" not in err


def test_compare_out_still_works_with_a_warning(tmp_path, capsys):
    target = tmp_path / "compare.csv"
    code, out, err = devprof(capsys, "compare", "--external", SEED_TABLE, "--format", "csv", "--out", target)
    assert code == 0 and out == ""
    assert target.read_text().startswith("run,")
    assert err.splitlines()[0] == "warning: --out is deprecated for compare; use --output (-o)"
    assert f"wrote {target}" in err


# ---------------------------------------------------------------- tracer options


TRACER_FLAGS = ["--host-tracer-level", "3", "--device-tracer-level", "0", "--python-tracer"]


def test_run_and_capture_share_the_tracer_options(tmp_path):
    parsers = subparsers()
    for_run, for_capture = (
        {
            a.dest: (tuple(a.option_strings), a.default, a.choices, a.help)
            for a in parsers[name]._actions
            if a.dest in {"host_tracer_level", "device_tracer_level", "python_tracer"}
        }
        for name in ("run", "capture")
    )
    assert len(for_run) == 3 and for_run == for_capture
    parser = cli.build_parser()
    defaults = [parser.parse_args(["run"]), parser.parse_args(["capture", "grpc://h:1"])]
    assert [common.tracer_options(a) for a in defaults] == [tracing.TracerOptions(2, 1, 0)] * 2
    given = [parser.parse_args(["run", *TRACER_FLAGS]), parser.parse_args(["capture", "grpc://h:1", *TRACER_FLAGS])]
    assert [common.tracer_options(a) for a in given] == [tracing.TracerOptions(3, 0, 1)] * 2


def test_run_and_capture_pass_the_tracer_options_on(tmp_path, monkeypatch, capsys):
    import profiler.train.run

    seen = {}

    class FakeRun:
        def __init__(self, config):
            seen["run"] = config.tracer
            self.console = profiler.train.run.Console(quiet=True)
            self.path = tmp_path / "r"

        def execute(self):
            return self.path

    def fake_capture(address, logdir, duration_ms, host, device, python):
        seen["capture"] = tracing.TracerOptions(host, device, python)

    monkeypatch.setattr(profiler.train.run, "Run", FakeRun)
    monkeypatch.setattr(tracing, "capture", fake_capture)
    monkeypatch.setattr(tracing, "newest_xplane", lambda logdir: None)
    assert devprof(capsys, "run", "--out", tmp_path, *TRACER_FLAGS)[0] == 0
    assert devprof(capsys, "capture", "grpc://localhost:1", "--out", tmp_path, *TRACER_FLAGS)[0] == 0
    assert seen == {"run": tracing.TracerOptions(3, 0, 1), "capture": tracing.TracerOptions(3, 0, 1)}


def test_capture_names_the_worker_that_sent_no_trace(tmp_path, monkeypatch, capsys):
    def one_host_only(address, logdir, duration_ms, host, device, python):
        session = Path(logdir) / "plugins" / "profile" / "2026_12_02_04_00_00"
        session.mkdir(parents=True)
        (session / "10.0.0.1_6009.xplane.pb").write_bytes(b"")

    monkeypatch.setattr(tracing, "capture", one_host_only)
    code, out, err = devprof(
        capsys, "capture", "grpc://10.0.0.1:6009,grpc://10.0.0.2:6009", "--duration-ms", "800", "--out", tmp_path
    )
    assert code == 0
    assert "traces written: 1" in out and "(expected one per host: 2)" in out
    assert err.splitlines()[-1].startswith("warning: no trace from grpc://10.0.0.2:6009: it recorded nothing in 800 ms")
    assert "10.0.0.1" not in err.splitlines()[-1]


# ---------------------------------------------------------------- version, help, errors


def test_version_is_the_installed_metadata_version(capsys):
    code, out, _ = devprof(capsys, "--version")
    assert code == 0 and out == f"devprof {metadata.version('devprof')}\n"


def test_version_without_metadata_is_unknown(monkeypatch):
    from profiler.record import version

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert version._installed_version() == "0+unknown"


@pytest.mark.slow
def test_devprof_script_prints_the_version():
    script = Path(sys.executable).with_name("devprof")
    if not script.exists():
        pytest.skip("the devprof console script is not installed beside this Python")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"devprof {metadata.version('devprof')}\n"


def test_every_subcommand_help_lists_its_options(capsys):
    for name, parser in subparsers().items():
        code, out, _ = devprof(capsys, name, "--help")
        assert code == 0, name
        options = [o for a in parser._actions for o in a.option_strings]
        assert options, name
        for option in options:
            assert option in out, (name, option)
        for action in parser._actions:
            assert action.help, (name, action.dest)


def test_usage_errors_are_one_line_with_a_hint(capsys):
    code, out, err = devprof(capsys, "devices", "--format", "yaml")
    assert code == common.EXIT_USAGE and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(see 'devprof devices --help')" in lines[0]
    assert devprof(capsys, "no-such-command")[0] == common.EXIT_USAGE


def test_error_helper_prints_one_line_and_returns_the_exit_code(capsys):
    assert common.error("it broke", hint="try again", code=common.EXIT_FAILURE) == 1
    assert common.error("bad option") == 2
    assert capsys.readouterr().err == "error: it broke (try again)\nerror: bad option\n"


# ---------------------------------------------------------------- the program's exit


class _Exited(Exception):
    def __init__(self, how: str, code):
        super().__init__(how, code)
        self.how, self.code = how, code


@pytest.fixture
def exits(monkeypatch):
    """`program()`'s ending, recorded instead of ending pytest: ("os._exit" or "sys.exit", code)."""

    def quick(code):
        raise _Exited("os._exit", code)

    def usual(code=0):
        raise _Exited("sys.exit", code)

    monkeypatch.setattr(cli.os, "_exit", quick)
    monkeypatch.setattr(cli.sys, "exit", usual)


@pytest.mark.parametrize(
    ("argv", "how", "code"),
    [
        (["compare", "--external", str(SEED_TABLE)], "os._exit", 0),  # read-only: no freeing object by object
        (["compare", "--external", "no-such-table.csv"], "os._exit", 2),
        (["devices", "--format", "json"], "sys.exit", 0),  # others end as Python ends
    ],
)
def test_the_program_ends_read_only_commands_at_once_after_their_output(
    fake_devices, exits, monkeypatch, capsys, argv, how, code
):
    monkeypatch.setattr(sys, "argv", ["devprof", *argv])
    # One thread, as in devprof's own process: pytest's may still hold another test's (Dask's IO loop).
    monkeypatch.setattr(cli.threading, "active_count", lambda: 1)
    with pytest.raises(_Exited) as ended:
        cli.program()
    assert (ended.value.how, ended.value.code) == (how, code)
    out = capsys.readouterr().out
    assert ("Test CPU" in out) if argv[0] == "devices" else (code != 0 or "i7-9700K" in out)


def test_the_program_ends_as_python_does_while_another_thread_runs(exits, monkeypatch, capsys):
    import threading

    monkeypatch.setattr(sys, "argv", ["devprof", "compare", "--external", str(SEED_TABLE)])
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        with pytest.raises(_Exited) as ended:
            cli.program()
    finally:
        release.set()
        other.join()
    assert (ended.value.how, ended.value.code) == ("sys.exit", 0)


# ---------------------------------------------------------------- a bug, with and without DEVPROF_DEBUG


def test_debug_off_gives_one_line_for_a_bug(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("a bug")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser.set_defaults(handler=broken)
    monkeypatch.setenv("DEVPROF_DEBUG", "0")
    assert cli.main([]) == 1
    assert capsys.readouterr().err.startswith("error: None failed: RuntimeError: a bug")
    monkeypatch.setenv("DEVPROF_DEBUG", "yes")
    with pytest.raises(RuntimeError):
        cli.main([])


# ---------------------------------------------------------------- capture options


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--duration-ms", "-5"], "--duration-ms must be a whole number of milliseconds from 1"),
        (["--duration-ms", "0"], "--duration-ms must be"),
        (["--duration-ms", str(2**31)], "--duration-ms must be"),
        (["--duration-ms", "nan"], "invalid int value"),
        (["--duration-ms", "inf"], "invalid int value"),
        (["--duration-ms", "1.5"], "invalid int value"),
        (["--host-tracer-level", "7"], "invalid choice"),
    ],
    ids=["negative", "zero", "too-long", "nan", "inf", "fraction", "tracer-level"],
)
def test_capture_options_are_checked_first(tmp_path, capsys, monkeypatch, args, expect):
    from profiler.record import tracing

    monkeypatch.setattr(tracing, "capture", lambda *a, **k: pytest.fail("capture was attempted"))
    out = tmp_path / "captures"
    line = one_usage_error(cli.main(["capture", "grpc://localhost:6009", *args, "--out", str(out)]), capsys)
    assert expect in line, line
    assert files_under(tmp_path) == []


@pytest.mark.parametrize(
    "address",
    ["grpc://localhost:0", "grpc://localhost:65536", "grpc://localhost:99999999999", "grpc://h:1,grpc://h2:0"],
)
def test_capture_ports_out_of_range(tmp_path, capsys, monkeypatch, address):
    from profiler.record import tracing

    monkeypatch.setattr(tracing, "capture", lambda *a, **k: pytest.fail("capture was attempted"))
    line = one_usage_error(cli.main(["capture", address, "--out", str(tmp_path / "c")]), capsys)
    assert "1 to 65535" in line, line
    assert files_under(tmp_path) == []


def test_capture_out_that_is_a_file(tmp_path, capsys, monkeypatch):
    from profiler.record import tracing

    monkeypatch.setattr(tracing, "capture", lambda *a, **k: pytest.fail("capture was attempted"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_usage_error(cli.main(["capture", "grpc://localhost:6009", "--out", str(blocker / "c")]), capsys)
    assert "--out" in line and "is a file" in line, line


# ---------------------------------------------------------------- help, values that begin with a dash, and a stdout closed early or not at all


@pytest.mark.parametrize("command", ["run", "capture"])
def test_help_shows_each_default_once_and_none_for_switches(capsys, command):
    from profiler import cli

    assert cli.main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    # "--no-profile ... (default: True)" read as "profiling is off by default".
    assert "(default: True)" not in text and "(default: False)" not in text and "(default: None)" not in text
    assert not re.search(r"\(default: [^)]*\)\s*\(default:", text), text
    if command == "run":
        assert "--no-profile no profiler window --profile-steps" in text
        assert "seconds between samples (minimum 0.05) (default: 0.5)" in text


def test_a_reader_that_closes_the_pipe_early_ends_devprof_quietly(tmp_path, capsys, monkeypatch):
    """`devprof analyze ... | head`: 'error: analyze failed: BrokenPipeError' was printed."""
    from profiler import cli

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.build_parser()
    assert parser._subparsers is not None
    commands = cast(argparse._SubParsersAction, parser._subparsers._group_actions[0])
    commands.choices["analyze"].set_defaults(handler=closed_pipe)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(cli, "_stdout_to_devnull", lambda: None)  # pytest's own stdout stays as it is
    assert cli.main(["analyze", str(tmp_path / "t.xplane.pb")]) == cli.EXIT_BROKEN_PIPE
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run", "--profile-steps", "-1:2"], ["analyze", "runs/a", "--step-name", "-train"]])
def test_a_value_that_begins_with_a_dash_is_told_how_to_write_it(argv, capsys):
    line = one_usage_error(cli.main(argv), capsys)
    option = argv[-2]
    assert f"argument {option}: expected one argument" in line and f"is written {option}=VALUE" in line


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return hostile_trace(tmp_path_factory.mktemp("hostile") / "plugins" / "profile" / "s" / "host.xplane.pb")


@pytest.mark.slow
def test_a_closed_stdout_is_one_error_line_not_a_traceback(trace):
    proc = subprocess.run(
        f"{sys.executable} -m profiler.cli analyze {trace} >&-",
        shell=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "Traceback" not in proc.stderr.decode(), proc.stderr.decode()[-800:]
