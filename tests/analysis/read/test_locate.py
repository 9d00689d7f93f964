"""Finding the trace behind a user's path: one entry, gzipped sessions, traces that are no regular file,
odd characters, links that lead nowhere, and a run.json above a log folder that is not its run."""

from __future__ import annotations

import pytest

import analysis
from cli_checks import devprof, error_line
from marker_traces import marker_trace
from odd_files import _fifo, _link_to_dev_zero
from profiler import cli

# ---------------------------------------------------------------- a trace that is no regular file


@pytest.mark.parametrize("make", [_link_to_dev_zero, _fifo], ids=["dev-zero", "fifo"])
def test_a_trace_that_is_no_regular_file_is_an_error_not_a_hang(tmp_path, capsys, make):
    session = tmp_path / "logs" / "plugins" / "profile" / "2030_01_01_00_00_00"
    make(session / "host.xplane.pb")
    code, _, err = devprof(capsys, "analyze", tmp_path / "logs")
    assert code == 1
    assert "not a trace file" in error_line(err) or "not a profiler trace" in error_line(err)
    code, _, err = devprof(capsys, "analyze", session / "host.xplane.pb")
    assert code == 1 and "host.xplane.pb" in error_line(err)


# ---------------------------------------------------------------- a folder of one entry, a session of gzipped traces


def test_one_entry_is_one_entry(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    code, _, err = devprof(capsys, "analyze", tmp_path)
    assert code == 1 and "found 1 entry (notes.txt)" in error_line(err)


def test_a_session_of_only_gzipped_traces_says_to_unzip_them(tmp_path, capsys):
    session = tmp_path / "logs" / "plugins" / "profile" / "2030_01_01_00_00_00"
    session.mkdir(parents=True)
    (session / "host.xplane.pb.gz").write_bytes(b"\x1f\x8b\x08\x00")
    code, _, err = devprof(capsys, "analyze", tmp_path / "logs")
    line = error_line(err)
    assert code == 1 and "host.xplane.pb.gz is gzipped: unzip it first" in line, line
    code, _, err = devprof(capsys, "analyze", session / "host.xplane.pb.gz")
    assert code == 1 and "is gzipped: unzip it first" in error_line(err)


# ---------------------------------------------------------------- odd characters in the path


def test_a_trace_path_with_odd_characters_is_read(tmp_path, capsys):
    folder = tmp_path / "odd name; $(x) \u00e9\u6f22 'q\"" / "plugins" / "profile" / "2030_01_01_00_00_00"
    marker_trace(folder / "h\u00f6st name.xplane.pb")
    code, out, err = devprof(capsys, "analyze", tmp_path / "odd name; $(x) \u00e9\u6f22 'q\"")
    assert code == 0, err
    assert "10 steps" not in out and "6 steps found by markers" in out, out


# ---------------------------------------------------------------- links that lead nowhere; a run.json above the log folder


def test_a_run_path_that_links_to_itself_is_named_as_a_link_not_as_missing(tmp_path, capsys):
    """Was `no such file or directory`: exists() follows the link, and a loop leads nowhere."""
    loop = tmp_path / "run"
    loop.symlink_to(loop)
    assert cli.main(["analyze", str(loop)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {loop} is a link that leads nowhere (to {loop}: a loop of links or a missing target)"]


def test_a_run_json_above_the_log_layout_is_not_adopted(tmp_path):
    from compare_fixtures import make_run
    from marker_traces import marker_trace

    unrelated = make_run(tmp_path, "unrelated", status="failed")
    logs = unrelated / "some" / "logs"
    marker_trace(logs / "plugins" / "profile" / "s" / "host.xplane.pb")
    result = analysis.analyze(logs)
    assert result.run_dir is None and result.record is None
    assert not any("failed" in note for note in result.notes)


def test_a_dangling_link_elsewhere_in_the_folder_does_not_stop_the_analysis(tmp_path):
    from marker_traces import marker_trace

    logs = tmp_path / "logs"
    for host in ("h1", "h2"):
        marker_trace(logs / "plugins" / "profile" / "s" / f"{host}.xplane.pb")
    (logs / "old").mkdir()
    (logs / "old" / "stale.xplane.pb").symlink_to(tmp_path / "nowhere")
    assert len(analysis.analyze(logs).steps) == 6
