"""Where `analyze` and `compare` write: never through a link out of the run or at a temporary name, into
FIFOs and open descriptors rather than over them, with the permissions any new file gets, and refused
before the analysis when the name cannot work (a folder, an extension no format writes, an input)."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pandas as pd
import pytest

from cli_checks import HANG_LIMIT_S, devprof, error_line, one_usage_error
from compare_fixtures import _traced_run
from profiler import cli
from run_fixtures import make_run, small_run, step_line
from run_fixtures import make_run as make_small_run

# ---------------------------------------------------------------- writing never follows a link out of the run


def test_an_analysis_folder_linked_out_of_the_run_is_not_written(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    elsewhere = tmp_path / "someone-elses-report"
    elsewhere.mkdir()
    (elsewhere / "report.md").write_text("keep me")
    (elsewhere / "analysis.json").write_text("{}")
    (run / "analysis").symlink_to(elsewhere, target_is_directory=True)
    code, out, err = devprof(capsys, "analyze", run)
    assert code == 1
    line = error_line(err)
    assert "outside the run folder" in line and str(elsewhere) in line, line
    assert "verdict:" in out  # the analysis is still printed
    assert (elsewhere / "report.md").read_text() == "keep me"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["analysis.json", "report.md"]


def test_an_analysis_folder_linked_inside_the_run_is_written(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    (run / "reports").mkdir()
    (run / "analysis").symlink_to(run / "reports", target_is_directory=True)
    code, _, err = devprof(capsys, "analyze", run)
    assert code == 0, err
    assert (run / "reports" / "report.md").is_file()


def test_outputs_get_the_permissions_any_new_file_gets(tmp_path, capsys):
    """Written under a private temporary name, then given the mode open() would have given them."""
    run = small_run(tmp_path / "run")
    mask = os.umask(0o022)
    try:
        code, _, err = devprof(capsys, "analyze", run)
    finally:
        os.umask(mask)
    assert code == 0, err
    written = list((run / "analysis").iterdir())
    assert written and {path.stat().st_mode & 0o777 for path in written} == {0o644}, written


def test_output_is_never_written_through_a_link_at_its_temporary_name(tmp_path, capsys):
    """The temporary file is made new: a link planted where the old fixed name would be is left alone."""
    run = small_run(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / f".report.{os.getpid()}.tmp.md").symlink_to(victim)
    code, _, err = devprof(capsys, "analyze", run, "-o", out_dir / "report.md")
    assert code == 0, err
    assert victim.read_text() == "keep me"
    assert (out_dir / "report.md").read_text().startswith("# devprof analysis")


def test_output_named_by_a_link_replaces_the_link_not_its_target(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    victim = tmp_path / "victim.md"
    victim.write_text("keep me")
    (tmp_path / "report.md").symlink_to(victim)
    code, _, err = devprof(capsys, "analyze", run, "-o", tmp_path / "report.md")
    assert code == 0, err
    assert victim.read_text() == "keep me" and not (tmp_path / "report.md").is_symlink()


def _read_fifo_in_a_thread(fifo: Path) -> dict:
    """A reader at the other end of `fifo`, as a shell's `>(...)` or `| cat` would be."""
    got: dict = {}

    def read():
        with open(fifo, "rb") as stream:
            got["bytes"] = stream.read()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    got["thread"] = thread
    return got


@pytest.mark.parametrize(
    "argv, starts",
    [
        (["analyze", "RUN", "--format", "json", "-o", "OUT"], b"{"),
        (["compare", "RUN", "--format", "markdown", "-o", "OUT"], b"#"),
        (["compare", "RUN", "--plot", "OUT"], b"\x89PNG"),
    ],
    ids=["analyze-o", "compare-o", "compare-plot"],
)
def test_an_output_named_as_a_fifo_or_device_is_written_into_not_replaced(tmp_path, capsys, argv, starts):
    """-o /dev/null, -o /dev/stdout or -o >(gzip > f) name a stream: renaming a file over it (the
    atomic write regular files get) would replace /dev/null itself for every program on the machine."""
    run = small_run(tmp_path / "run")
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    reader = _read_fifo_in_a_thread(fifo)
    code, _, err = devprof(capsys, *[run if a == "RUN" else fifo if a == "OUT" else a for a in argv])
    reader["thread"].join(HANG_LIMIT_S)
    assert code == 0, err
    assert fifo.is_fifo(), "the FIFO was replaced by a file"
    assert reader["bytes"].startswith(starts)
    assert not list(tmp_path.glob("out.png")) and not list(tmp_path.glob(".out*")), "nothing is written beside it"


def test_an_output_linked_to_a_fifo_is_written_into_and_a_block_device_never(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "stdout").symlink_to(fifo)  # as /dev/stdout links to the process's pipe
    reader = _read_fifo_in_a_thread(fifo)
    code, _, err = devprof(capsys, "analyze", run, "--format", "json", "-o", tmp_path / "stdout")
    reader["thread"].join(HANG_LIMIT_S)
    assert code == 0, err
    assert json.loads(reader["bytes"])["step_source"] and (tmp_path / "stdout").is_symlink()
    block = next((p for p in Path("/dev").glob("loop*") if p.is_block_device()), None)
    if block is not None:  # where the machine has one: the check runs before anything is opened
        code, _, err = devprof(capsys, "compare", run, "--plot", block)
        assert code == 2 and error_line(err).endswith("a block device, not written")


@pytest.mark.parametrize("name", ["dev-fd", "link-to-proc-fd"])
def test_an_output_naming_one_of_the_processs_open_files_is_written_into_it(tmp_path, capsys, name):
    """-o /dev/stdout > report.json: /dev/stdout is a link to /proc/self/fd/1 and that one to the
    shell's regular file. Renaming a file over the path replaced /dev/stdout itself for the machine;
    the output belongs in the file the descriptor has open, after what it already holds (`>>`)."""
    run = small_run(tmp_path / "run")
    target = tmp_path / "report.json"
    target.write_bytes(b"kept\n")
    with open(target, "ab") as held:
        fd_path = f"/dev/fd/{held.fileno()}"
        if name == "link-to-proc-fd":
            (tmp_path / "stdout").symlink_to(f"/proc/self/fd/{held.fileno()}")
            fd_path = str(tmp_path / "stdout")
        code, _, err = devprof(capsys, "analyze", run, "--format", "json", "-o", fd_path)
        assert code == 0, err
    text = target.read_text()
    assert text.startswith("kept\n") and json.loads(text[len("kept\n") :])["schema_version"] == 1
    if name == "link-to-proc-fd":
        assert (tmp_path / "stdout").is_symlink()


def test_a_plot_named_with_another_extension_is_refused(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    code, _, err = devprof(capsys, "compare", run, "--plot", tmp_path / "chart.txt")
    assert code == 2 and "the chart is a PNG; name it" in error_line(err)
    assert not (tmp_path / "chart.txt").exists()


# ---------------------------------------------------------------- extensions no format writes, folders that are missing


@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_an_output_extension_no_format_writes_is_refused(tmp_path, capsys, command):
    run = small_run(tmp_path / "run")
    runs = [run] if command == "analyze" else [run, small_run(tmp_path / "other")]
    line = one_usage_error(cli.main([command, *map(str, runs), "-o", str(tmp_path / "report.pdf")]), capsys)
    assert "no format writes .pdf files" in line and ".html" in line, line
    assert not (tmp_path / "report.pdf").exists() and not (run / "analysis").exists()
    assert cli.main([command, *map(str, runs), "-o", str(tmp_path / "report.pdf"), "--format", "html"]) == 0


def test_an_output_under_a_missing_folder_creates_only_the_last_folder(tmp_path, capsys):
    from marker_traces import marker_trace
    from profiler import cli

    trace = marker_trace(tmp_path / "t.xplane.pb")
    assert cli.main(["analyze", str(trace), "-o", str(tmp_path / "new" / "r.md")]) == 0
    assert (tmp_path / "new" / "r.md").is_file()
    code = cli.main(["analyze", str(trace), "-o", str(tmp_path / "missing" / "deeper" / "r.md")])
    err = capsys.readouterr().err
    assert code != 0 and "error: cannot write" in err and "No such file or directory" in err, err
    assert not (tmp_path / "missing").exists()


# ---------------------------------------------------------------- analyze and compare: outputs found wrong before the analysis


def test_an_output_that_is_a_folder_or_an_out_that_is_a_file_is_a_usage_error_before_the_analysis(tmp_path, capsys):
    """Were exit 1 after the whole analysis ('runs is a folder', '--out afile: File exists')."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    folder = tmp_path / "reports"
    folder.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    line = one_usage_error(cli.main(["analyze", str(run), "-o", str(folder)]), capsys)
    assert line == f"error: -o {folder}: is a folder; name the file, e.g. {folder / 'report.html'}"
    line = one_usage_error(cli.main(["analyze", str(run), "--out", str(afile)]), capsys)
    assert line.startswith(f"error: --out {afile}: is a file, not a folder")
    line = one_usage_error(cli.main(["compare", str(run), "-o", str(folder)]), capsys)
    assert line == f"error: -o {folder}: is a folder; name the file, e.g. {folder / 'compare.txt'}"
    assert not (run / "analysis").exists() and list(folder.iterdir()) == [] and afile.read_text() == "x"


class _FullDisk:
    """stdout redirected to a full disk (`> /dev/full`): every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass

    def fileno(self):
        raise ValueError("no descriptor")


@pytest.mark.parametrize("command, what", [("analyze", "the analysis"), ("compare", "the comparison")])
def test_stdout_on_a_full_disk_is_one_error_line(tmp_path, capsys, monkeypatch, command, what):
    """Was 'error: analyze failed: OSError: [Errno 28] ... (set DEVPROF_DEBUG=1 for the traceback)', as for a bug."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    args = [command, str(run)] + (["--format", "json"] if command == "analyze" else [])
    monkeypatch.setattr("sys.stdout", _FullDisk())
    code = cli.main(args)
    err = capsys.readouterr().err
    assert code == 1
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: cannot write {what} to stdout: No space left on device"
    ]


# ---------------------------------------------------------------- an output that would replace an input


@pytest.mark.parametrize(
    "outputs, said",
    [
        (lambda run, tmp: ["-o", str(run / "run.json")], "that is a file devprof reads for this analysis"),
        (lambda run, tmp: ["-o", str(run / "steps.csv")], "that is a file devprof reads for this analysis"),
        (lambda run, tmp: ["--perfetto", str(run / "plugins/profile/s/host.xplane.pb")], "a file devprof reads"),
        (
            lambda run, tmp: ["-o", str(tmp / "x.json"), "--perfetto", str(tmp / "x.json")],
            "-o and --perfetto both name",
        ),
        (lambda run, tmp: ["--out", str(tmp / "d"), "-o", str(tmp / "d" / "ops.csv")], "gets its own ops.csv"),
    ],
)
def test_an_output_that_would_replace_an_input_or_another_output_is_refused(tmp_path, capsys, outputs, said):
    from cli_checks import one_usage_error

    run = _traced_run(tmp_path, "run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code = cli.main(["analyze", str(run), *outputs(run, tmp_path)])
    assert said in one_usage_error(code, capsys)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing replaced


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


# ---------------------------------------------------------------- a folder that cannot be written


def test_analyze_prints_the_analysis_when_the_folder_cannot_be_written(tmp_path, capsys):
    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(8)])
    code, out, err = run_cli(["analyze", run, "--format", "json", "--out", "/proc/devprof-analysis"], capsys)
    assert code == 1
    assert json.loads(out)["steps_used"] >= 3  # the whole analysis, before the error
    errors = lines_starting(err, "error:")
    assert len(errors) == 1 and "--out DIR" in errors[0] and "/proc/devprof-analysis" in errors[0], err
    assert "Traceback" not in err


def test_analyze_on_a_full_disk_leaves_no_cut_file(tmp_path, capsys, monkeypatch):
    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(8)])
    out_dir = run / "analysis"
    real = Path.write_text
    calls = []

    def fill_the_disk(self, text, *args, **kwargs):
        calls.append(self.name)
        if len(calls) >= 2:  # the first file fits; the second is cut short and the disk is full
            with open(self, "w") as handle:
                handle.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", fill_the_disk)
    code, out, err = run_cli(["analyze", run], capsys)
    assert code == 1
    assert "verdict:" in out  # the text analysis is on stdout
    errors = lines_starting(err, "error:")
    assert len(errors) == 1 and "No space left on device" in errors[0] and "--out DIR" in errors[0], err
    monkeypatch.setattr(Path, "write_text", real)
    left = sorted(p.name for p in out_dir.iterdir())
    assert not [name for name in left if ".tmp" in name], left  # no temporary file left behind
    assert "epoch_breakdown.csv" not in left  # the file that did not fit is not there, cut or empty
    for csv in out_dir.glob("*.csv"):
        assert pd.read_csv(csv).shape[0] >= 1
    import psutil

    assert not psutil.Process().children()  # a plot helper forked for the files is ended with the command
