"""The run-directory contract: tolerant readers, one-line errors naming the file, and one
utilization summary shared by `analyze` and `compare`."""

from __future__ import annotations

import json
import os
import re
import warnings

import pandas as pd
import pytest

import analysis
from analysis import pipeline
from analysis.read import run_csvs, run_files
from analysis.read.run_files import RunFileError, RunFileWarning
from cli_checks import devprof, error_line, finishes
from compare_fixtures import _traced_run
from compare_fixtures import make_run as make_compare_run
from odd_files import _fifo, _link_to_dev_zero
from profiler import cli
from run_fixtures import HEADER, edit_run_json, make_run, small_run, step_line
from run_fixtures import make_run as make_small_run


def test_steps_csv_skips_rows_that_do_not_parse_with_one_warning(tmp_path):
    good = [step_line(i) for i in range(6)]
    bad = [
        "1,6,1,1700000000.06,,8.0,1.0,10.0,100",  # empty cell
        "1,7,1,1700000000.07,oops,8.0,1.0,10.0,100",  # not a number
        "1,8,1,1700000000.08,inf,8.0,1.0,10.0,100",  # infinite
        "1,9,1,1700000000.09,1.0,8.0",  # too few cells
        "1,10,1,1700000000.10,-5,8.0,1.0,10.0,100",
    ]  # negative time
    path = tmp_path / "steps.csv"
    path.write_text("\n".join([HEADER, *good[:3], *bad, *good[3:]]) + "\n" + step_line(99)[:12])  # cut-off last line
    with pytest.warns(RunFileWarning) as caught:
        frame = run_csvs.read_steps_csv(path)
    assert len(caught) == 1
    assert str(path) in str(caught[0].message) and "skipped 5 of" in str(caught[0].message)
    assert frame["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert frame["input_ms"].tolist() == [1.0] * 6 and frame["step"].dtype == "int64"


def test_clean_steps_csv_reads_without_warning(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("\n".join([HEADER, *(step_line(i) for i in range(3))]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(run_csvs.read_steps_csv(path)) == 3


@pytest.mark.parametrize(
    "content, expected",
    [
        ("[1, 2, 3]", "expected a JSON object, got a list"),
        ('{"status": ', "not valid JSON"),
    ],
)
def test_run_json_that_is_not_an_object_names_the_file(tmp_path, content, expected):
    path = tmp_path / "run.json"
    path.write_text(content)
    with pytest.raises(RunFileError) as caught:
        run_files.read_run_json(path)
    assert str(path) in str(caught.value) and expected in str(caught.value)


def test_epochs_that_are_not_a_list_of_objects_name_the_file(tmp_path):
    with pytest.raises(RunFileError, match="run.json: 'epochs' must be a list of objects"):
        run_files.run_epochs({"epochs": "lots"}, tmp_path / "run.json")
    with pytest.raises(RunFileError, match="lack 'seconds'"):
        run_files.run_epochs({"epochs": [{"epoch": 1}]}, "run.json")


def test_analyze_and_compare_report_the_same_time_weighted_cpu(tmp_path, capsys):
    # Samples 1 s apart except one that covers 3 s: the unweighted mean of cpu_pct is
    # (10 + 10 + 70 + 10) / 4 = 25 %, the time-weighted one (10 + 3 * 70 + 10) / 5 = 46 %.
    host_rows = [(0.0, 10.0, 50.0, 1e8), (1.0, 10.0, 50.0, 1e8), (4.0, 70.0, 90.0, 2e8), (5.0, 10.0, 50.0, 1e8)]
    stale = {"host": {"metrics": {"cpu_pct": {"mean": 99.0, "p50": 99.0, "p95": 99.0, "max": 99.0}}}}
    run = make_run(tmp_path / "run", [step_line(i) for i in range(8)], host_rows=host_rows, summaries=stale)

    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    analyzed = json.loads(capsys.readouterr().out)
    assert cli.main(["compare", str(run), "--format", "json"]) == 0
    compared = json.loads(capsys.readouterr().out)["rows"][0]

    expected = (10.0 + 3 * 70.0 + 10.0) / 5
    assert analyzed["utilization"]["cpu_util_mean_pct"] == pytest.approx(expected)
    assert compared["cpu_util_mean_pct"] == pytest.approx(expected)
    assert "mean host cpu 46 %" in analyzed["verdict"]["evidence"]


def test_summaries_in_run_json_are_used_when_the_csvs_are_gone(tmp_path, capsys):
    kept = {"host": {"metrics": {"cpu_pct": {"mean": 42.0, "p50": 40.0, "p95": 80.0, "max": 90.0}}}}
    run = make_run(tmp_path / "run", [step_line(i) for i in range(8)], summaries=kept)
    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["utilization"]["cpu_util_mean_pct"] == 42.0


def test_too_few_steady_steps_give_no_verdict(tmp_path, capsys):
    # The first call compiles (500 ms more than the others): two steady calls are left, too few.
    lines = [step_line(0, call_ms=508.0), step_line(1), step_line(2)]
    run = make_run(tmp_path / "tiny", lines)
    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert verdict["bound"] is None and verdict["level"] is None and verdict["advice"] == []
    assert "only 2 steady steps" in verdict["reason"]
    assert cli.main(["analyze", str(run)]) == 0
    assert "verdict: none (only 2 steady steps" in capsys.readouterr().out
    # One more steady call is enough.
    run = make_run(tmp_path / "enough", [*lines, step_line(3)])
    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert verdict["bound"] == "compute" and verdict["first_fix"]["rule"] == "input_wait"  # 1 of 10 ms waits


def contended_host_rows(cores=2, system_pct=98.0, proc_cores=1.0, samples=6):
    """A host.csv where the machine is busy but the training process uses only `proc_cores` cores."""
    rows = []
    for i in range(samples):
        rows.append(
            {
                "time_s": float(i),
                "cpu_pct": system_pct,
                **{f"cpu{c}_pct": system_pct for c in range(cores)},
                "proc_cpu_pct": 100.0 * proc_cores,
                "proc_rss_bytes": 1e8,
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("proc_cores, contended", [(1.0, True), (1.9, False)])
def test_cpu_contention_is_named_in_analyze_and_compare(tmp_path, capsys, proc_cores, contended):
    run = make_run(tmp_path / "run", [step_line(i) for i in range(8)])
    (run / "utilization").mkdir()
    contended_host_rows(proc_cores=proc_cores).to_csv(run / "utilization" / "host.csv", index=False)

    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    analyzed = json.loads(capsys.readouterr().out)
    # 98 % of 2 cores is 1.96 cores; training took `proc_cores`, other processes the rest
    assert analyzed["utilization"]["other_cpu_mean_pct"] == pytest.approx(98.0 - 50.0 * proc_cores)
    assert "training process cpu" in analyzed["verdict"]["evidence"]
    rules_found = [f["rule"] for f in analyzed["findings"]]
    assert rules_found == (["cpu_contention"] if contended else [])
    if contended:
        finding = analyzed["findings"][0]
        assert finding["severity"] == "warning" and "48 % of the machine's CPU" in finding["evidence"]
        assert "idle machine" in finding["advice"]

    assert cli.main(["compare", str(run), "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert ("cpu_contention" in row["why"]) == contended
    assert [f["rule"] for f in row["findings"]] == rules_found


def test_images_per_second_means_training_images_over_training_seconds_everywhere(tmp_path, capsys):
    epochs = [
        {"epoch": 1, "seconds": 3.0, "train_seconds": 2.5, "images": 1000, "images_per_second": 400.0},
        {"epoch": 2, "seconds": 2.0, "train_seconds": 1.6, "images": 1000, "images_per_second": 625.0},
    ]
    run = make_run(tmp_path / "run", [step_line(i) for i in range(8)], epochs=epochs)
    assert cli.main(["compare", str(run), "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["images_per_second"] == pytest.approx(625.0)  # what run.json and the console say for epoch 2
    assert row["epoch_images_per_second"] == pytest.approx(500.0)  # 1000 images over the 2.0 s epoch


def test_epoch_result_carries_both_rates():
    from models.training import EpochResult

    result = EpochResult(
        epoch=1,
        seconds=2.0,
        train_seconds=1.6,
        images=1000,
        images_per_second=625.0,
        loss=1.0,
        accuracy=0.5,
        val_loss=1.0,
        val_accuracy=0.5,
    )
    record = result.as_dict()
    assert record["images_per_second"] == 625.0 and record["epoch_images_per_second"] == pytest.approx(500.0)


def test_a_multi_worker_run_directory_has_one_row_per_worker_and_names_the_straggler(tmp_path, capsys):
    import shutil

    import trace_fixtures as fx

    session = fx.write_synthetic_session(tmp_path / "session", workers=2, slow_worker=1, slow_part="host", extra_ms=8.0)
    job = tmp_path / "job"
    job.mkdir()
    (job / "run.json").write_text(json.dumps({"status": "complete", "workers": ["worker-0", "worker-1"]}))
    for index, trace in enumerate(session.files):
        worker = job / f"worker-{index}"
        worker.mkdir()
        (worker / "run.json").write_text(
            json.dumps({"status": "complete", "device": {"kind": "gpu", "host": f"node-{index}"}})
        )
        (worker / "plugins" / "profile" / "s").mkdir(parents=True)
        shutil.copy(trace, worker / "plugins" / "profile" / "s" / "host.xplane.pb")
    assert cli.main(["analyze", str(job), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(w["worker"], w["host"]) for w in result["workers"]] == [(0, "node-0"), (1, "node-1")]
    for key in ("step_ms", "input_ms", "compute_ms", "host_ms", "collective_ms"):
        assert all(isinstance(w[key], float) for w in result["workers"])
    assert result["straggler"]["worker"] == 1 and result["straggler"]["cause"] == "host"
    assert result["workers"][0]["collective_ms"] > result["workers"][1]["collective_ms"] + 6.0  # worker 0 waits
    assert (job / "analysis" / "report.md").is_file()  # the job's report, not worker 0's


# ---------------------------------------------------------------- files named on the command line: regular files only


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_files_named_on_the_command_line_that_are_no_regular_files_are_errors_not_hangs(tmp_path, capsys, kind):
    """--external and --peak-file are read like the run's own files: regular files only, never a
    device read without end nor a FIFO waited on."""
    path = tmp_path / "given"
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    run = small_run(tmp_path / "run")
    for argv in (["compare", "--external", path], ["analyze", run, "--peak-file", path]):
        code, _, err = devprof(capsys, *argv)
        assert code == 2, err
        line = error_line(err)
        assert str(path) in line and ("not a regular file" in line or "a folder" in line), line


# ---------------------------------------------------------------- only regular files are read, within a bound


@pytest.mark.parametrize("make", [_link_to_dev_zero, _fifo], ids=["dev-zero", "fifo"])
@pytest.mark.parametrize("name", ["host.csv", "gpu0.csv"])
def test_a_sampler_file_that_is_no_regular_file_is_skipped_in_analyze_and_compare(tmp_path, capsys, make, name):
    run = small_run(tmp_path / "run")
    make(run / "utilization" / name)
    other = small_run(tmp_path / "other")
    code, out, err = devprof(capsys, "analyze", run)
    assert code == 0, err
    assert f"warning: {run / 'utilization' / name}:" in err and "sampler skipped" in err, err
    code, out, err = devprof(capsys, "compare", run, other)
    assert code == 0, err
    assert "sampler skipped" in err


@pytest.mark.parametrize("make", [_link_to_dev_zero, _fifo], ids=["dev-zero", "fifo"])
@pytest.mark.parametrize("name", ["run.json", "steps.csv"])
def test_run_json_or_steps_csv_that_is_no_regular_file_is_an_error_not_a_hang(tmp_path, capsys, make, name):
    run = small_run(tmp_path / "run")
    (run / name).unlink()
    make(run / name)
    with pytest.raises(RunFileError, match="not a regular file|outside"):
        reader = run_files.read_run_json if name == "run.json" else run_csvs.read_steps_csv
        finishes(reader, run / name)
    code, _, err = devprof(capsys, "analyze", run)
    assert code in (1, 2), err
    error_line(err)
    code, _, err = devprof(capsys, "compare", run, small_run(tmp_path / "other"))
    if code == 0 and name == "run.json":  # compare leaves out a folder without a readable run.json, and says so
        assert "warning: skipped 1 folder" in err and str(run) in err, err
    elif code == 0:  # compare's figures come from run.json's epochs: it never opens steps.csv
        assert "sampler" not in err
    else:
        assert code in (1, 2) and str(run / name) in error_line(err), err


def test_files_above_their_bound_are_refused_before_they_are_read(tmp_path, monkeypatch):
    run = small_run(tmp_path / "run")
    monkeypatch.setattr(run_files, "RUN_JSON_MAX_BYTES", 100)
    monkeypatch.setattr(run_csvs, "CSV_MAX_BYTES", 100)  # the bound steps.csv's reader takes from run_files
    size = (run / "run.json").stat().st_size
    with pytest.raises(RunFileError, match=f"{size:,} bytes, above the 0 MiB"):
        run_files.read_run_json(run / "run.json")
    with pytest.raises(RunFileError, match="bytes, above the"):
        run_csvs.read_steps_csv(run / "steps.csv")


def test_a_run_file_linked_out_of_the_run_is_not_read(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"status": "complete", "epochs": [{"epoch": 1, "seconds": 9.0}]}))
    (run / "run.json").unlink()
    (run / "run.json").symlink_to(secret)
    code, _, err = devprof(capsys, "analyze", run)
    assert code == 1 and "outside" in error_line(err) and "not read" in error_line(err)


# ---------------------------------------------------------------- sampler files: rows out of order, values no sampler writes


def test_shuffled_sampler_rows_are_sorted_by_time_with_a_warning(tmp_path):
    start = 1_700_000_000.0
    rows = [[start - 0.05 + i * 0.02, 10.0 + i, 50.0, 1e8] for i in range(8)]  # samples over the 6 steps
    run = small_run(tmp_path / "run", host_rows=rows[::-1])  # newest first
    with pytest.warns(RunFileWarning, match="host.csv: rows are not in time order: sorted by time_s"):
        result = analysis.analyze(run)
    per_step = [c for c in result.steps.columns if c.startswith("cpu")]
    assert per_step and result.steps[per_step].notna().all().all(), result.steps
    ordered = small_run(tmp_path / "ordered", host_rows=rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunFileWarning)
        expected = analysis.analyze(ordered)
    pd.testing.assert_frame_equal(result.steps[per_step], expected.steps[per_step])


@pytest.mark.parametrize(
    "column, value",
    [
        ("cpu_pct", 1e9),
        ("cpu_pct", -50.0),
        ("proc_cpu_pct", float("inf")),
        ("proc_rss_bytes", -1.0),
        ("proc_rss_bytes", 1e30),
    ],
)
def test_sampler_values_no_sampler_writes_read_as_empty_with_a_warning(tmp_path, capsys, column, value):
    """A share over 100 % failed the report's own check ("internal error"); an infinite one printed
    "inf %". Such cells read as empty, named once; the other cells and rows stand."""
    start = 1_700_000_000.0
    rows = [[start - 0.05 + i * 0.02, 10.0 + i, 50.0, 1e8] for i in range(8)]
    good = small_run(tmp_path / "good", host_rows=rows)
    bad = small_run(tmp_path / "bad", host_rows=rows)
    host = bad / "utilization" / "host.csv"
    frame = pd.read_csv(host)
    frame.loc[2:4, column] = value
    frame.to_csv(host, index=False)
    with pytest.warns(RunFileWarning) as caught:
        samples = run_csvs.read_sampler_csv(host)
    assert [str(w.message) for w in caught] == [
        f"{host}: values no sampler writes (a share outside 0-100 %, a negative, infinite or impossibly large amount) "
        "read as empty: "
        f"{column} (3)"
    ]
    assert samples[column].isna().tolist() == [False, False, True, True, True, False, False, False]
    assert samples.drop(columns=column).equals(pd.read_csv(good / "utilization" / "host.csv").drop(columns=column))
    for command in (["analyze", bad], ["analyze", bad, "--format", "json"], ["compare", bad, good]):
        code, out, err = devprof(capsys, *command)
        assert code == 0 and "internal error" not in err and "inf %" not in out, err
        assert err.count("values no sampler writes") == 1, err


# ---------------------------------------------------------------- run.json and steps.csv that cannot be read


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"", "not valid JSON"),
        (b"\x00\xff\xfe binary junk \x89PNG", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
    ],
)
def test_run_json_that_is_no_json_is_one_error_line(tmp_path, capsys, content, expect):
    run = small_run(tmp_path / "run")
    (run / "run.json").write_bytes(content)
    for argv in (["analyze", run], ["compare", run, small_run(tmp_path / "other")]):
        code, _, err = devprof(capsys, *argv)
        assert code in (1, 2) and expect in error_line(err), err


def test_a_folder_named_like_a_run_file_is_one_error_line(tmp_path, capsys):
    run = small_run(tmp_path / "run")
    (run / "steps.csv").unlink()
    (run / "steps.csv").mkdir()
    (run / "utilization" / "host.csv").mkdir(parents=True)
    code, _, err = devprof(capsys, "analyze", run)
    assert code == 1, err
    error_line(err)


@pytest.mark.parametrize(
    "cell", [("step_ms", "1e300"), ("call_ms", "1e12"), ("images", "1e30"), ("start_time_s", "1e200")]
)
def test_one_absurd_steps_csv_row_is_dropped_with_a_warning_not_the_analysis(tmp_path, cell):
    from analysis.read.run_files import RunFileWarning
    from run_fixtures import make_run, step_line

    column, value = cell
    lines = [step_line(i) for i in range(8)]
    header = "epoch,step,steps,start_time_s,input_ms,call_ms,other_host_ms,step_ms,images".split(",")
    cells = lines[5].split(",")
    cells[header.index(column)] = value
    lines[5] = ",".join(cells)
    run = make_run(tmp_path / "run", lines)
    with pytest.warns(RunFileWarning, match=r"skipped 1 of 8 rows"):
        result = analysis.analyze(run)
    assert len(result.steps) == 7 and result.mean["step_ms"] == pytest.approx(10.0)


def test_run_files_that_are_no_regular_files_are_named_not_skipped_in_silence(tmp_path, capsys):
    from profiler import cli
    from run_fixtures import make_run, step_line

    linked = make_run(tmp_path / "linked", [step_line(i) for i in range(6)])
    (linked / "run.json").unlink()
    (linked / "run.json").symlink_to("/dev/zero")
    fifo = make_run(tmp_path / "fifo", [step_line(i) for i in range(6)])
    (fifo / "steps.csv").unlink()
    os.mkfifo(fifo / "steps.csv")
    assert cli.main(["analyze", str(linked)]) != 0
    assert "run.json (a character device): not a regular file, not read" in capsys.readouterr().err
    assert cli.main(["analyze", str(fifo)]) != 0
    assert "steps.csv (a FIFO): not a regular file, not read" in capsys.readouterr().err
    cli.main(["compare", str(linked), str(fifo)])
    err = capsys.readouterr().err
    assert f"{linked} (run.json (a character device))" in err and "steps.csv (a FIFO): not a regular file" in err, err


# ---------------------------------------------------------------- run files as other tools save them


def test_a_run_json_saved_with_a_byte_order_mark_is_read(tmp_path):
    """Notepad and PowerShell write UTF-8 with a BOM: was `run.json: not valid JSON (Unexpected UTF-8 BOM ...)`."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    path = run / "run.json"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert run_files.read_run_json(path)["status"] == "complete"
    assert len(analysis.analyze(run).steps) == 6
    peak = tmp_path / "peak.json"
    peak.write_bytes(b"\xef\xbb\xbf" + json.dumps({"peak_flops_per_second": {"float32": 1e12}}).encode())
    assert run_files.read_peak_file(peak)["peak_flops_per_second"] == {"float32": 1e12}


def test_an_unknown_run_status_is_said_and_read_as_unknown(tmp_path):
    """Was ignored without a word: a run.json `status` that no devprof writes."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    path = run / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": "exploded"}))
    with pytest.warns(run_files.RunFileWarning, match="'status' must be one of running, complete, failed, interrupted"):
        meta = run_files.read_run_json(path)
    assert meta["status"] is None


def _steps_csv(tmp_path, data: bytes):
    path = tmp_path / "steps.csv"
    path.write_bytes(data)
    with pytest.raises(RunFileError) as info:
        run_csvs.read_steps_csv(path)
    return str(info.value)


def test_a_steps_csv_in_utf16_says_so_not_that_every_column_is_missing(tmp_path):
    text = "\n".join([HEADER, *[step_line(i) for i in range(3)]]) + "\n"
    message = _steps_csv(tmp_path, text.encode("utf-16"))
    assert "not UTF-8 text (UTF-16" in message and "save it as UTF-8 CSV" in message
    assert "missing columns" not in message


def test_a_steps_csv_separated_by_semicolons_says_so(tmp_path):
    """A spreadsheet where the decimal mark is a comma saves ';' between cells."""
    lines = [HEADER, *[step_line(i) for i in range(3)]]
    text = "\n".join(line.replace(",", ";").replace(".", ",") for line in lines) + "\n"
    assert "separated by semicolons, not commas" in _steps_csv(tmp_path, text.encode())


def test_a_steps_csv_without_its_header_names_its_first_line(tmp_path):
    text = "\n".join(step_line(i) for i in range(3)) + "\n"
    message = _steps_csv(tmp_path, text.encode())
    assert "first line is not steps.csv's header (got '1,0,1," in message and f"expected the header {HEADER}" in message


def test_a_steps_csv_missing_some_columns_still_names_them(tmp_path):
    lines = [HEADER, *[step_line(i) for i in range(3)]]
    text = "\n".join(",".join(line.split(",")[:4]) for line in lines) + "\n"
    assert _steps_csv(tmp_path, text.encode()).endswith(
        "missing columns input_ms, call_ms, other_host_ms, step_ms, images"
    )


# ---------------------------------------------------------------- worker folders; a run file that cannot be read beside a trace


def test_two_folders_naming_the_same_worker_read_the_one_devprof_writes_and_say_so(tmp_path):
    for name in ("worker-00", "worker-0", "worker-1", "worker-001", "worker-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / run_files.RUN_JSON).write_text("{}")
    with pytest.warns(run_files.RunFileWarning) as caught:
        workers = run_files.worker_dirs(tmp_path)
    assert [path.name for path in workers] == ["worker-0", "worker-1", "worker-2"]
    messages = sorted(str(item.message) for item in caught)
    assert len(messages) == 2
    assert "worker-0, worker-00 all name worker 0; worker-0 is read" in messages[0]
    assert "worker-1, worker-001 all name worker 1; worker-1 is read" in messages[1]


@pytest.mark.parametrize(
    "odd, said",
    [
        ("zero", r"run\.json: a character device, not a regular file: not read"),
        ("fifo", r"steps\.csv: a FIFO, not a regular file: not read"),
        (
            "truncated",
            r"run\.json: not valid JSON .*: the run's settings are not read; its trace is analysed without them",
        ),
    ],
)
def test_a_run_file_that_cannot_be_read_is_named_once_and_the_trace_still_analysed(tmp_path, odd, said):
    from analysis.read.run_files import RunFileWarning

    run = _traced_run(tmp_path, odd)
    if odd == "zero":
        (run / "run.json").unlink()
        (run / "run.json").symlink_to("/dev/zero")
    elif odd == "fifo":
        (run / "steps.csv").unlink()
        os.mkfifo(run / "steps.csv")
    else:
        text = (run / "run.json").read_text()
        (run / "run.json").write_text(text[: len(text) // 2])
    with pytest.warns(RunFileWarning, match=said) as caught:
        result = analysis.analyze(run)
    assert sum(bool(re.search(said, str(w.message))) for w in caught) == 1
    assert result.step_source == "markers" and len(result.steps) == 6


def test_a_job_folder_left_out_is_named(tmp_path):
    import shutil

    from analysis.read.run_files import RunFileWarning
    from job_fixtures import write_job

    job = write_job(tmp_path)
    shutil.copytree(job.path / "worker-1", job.path / "worker-1 (copy)")
    shutil.copytree(job.path / "worker-1", job.path / "worker-2")
    (job.path / "worker-2" / "run.json").unlink()
    with pytest.warns(
        RunFileWarning,
        match=r"worker-1 \(copy\) is no worker-<i> name; worker-2 has no run\.json: "
        r"left out of the job",
    ):
        result = analysis.analyze(job.path)
    assert sorted(result.workers["worker"].tolist()) == [0, 1]


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


# ---------------------------------------------------------------- steps.csv rows twice or out of order


def test_duplicated_and_shuffled_steps_are_cleaned_with_one_warning(tmp_path, capsys):
    lines = [step_line(i) for i in range(10)]
    lines[0] = step_line(0, call_ms=500.0)  # the compile step
    messy = [*lines[5:], *lines, *lines[:5]]  # out of order, and half of the rows twice
    run = make_small_run(tmp_path / "run", messy, epochs=[{"epoch": 1, "seconds": 0.7, "images": 1000}])
    code, out, err = run_cli(["analyze", run, "--format", "json"], capsys)
    assert code == 0, err
    warnings = lines_starting(err, "warning:")
    assert len(warnings) == 1 and "dropped 10 rows" in warnings[0] and "sorted" in warnings[0], err
    document = json.loads(out)
    assert [s["step"] for s in document["steps"]] == list(range(10))
    assert document["steps"][0]["compile_ms"] > 400  # the first step is the compile step again
    assert document["steps_used"] == 9 and document["mean"]["step_ms"] == pytest.approx(10.0)
    epoch = document["epochs"][0]
    assert epoch["calls"] == 10 and epoch["epoch_level_s"] >= 0
    for key, value in epoch.items():
        if key.endswith("_pct"):
            assert 0 <= value <= 100, (key, value)


def test_an_epoch_shorter_than_its_steps_is_a_warning_not_a_negative_time(tmp_path, capsys):
    run = make_small_run(
        tmp_path / "run", [step_line(i) for i in range(10)], epochs=[{"epoch": 1, "seconds": 0.05, "images": 1000}]
    )  # the steps take 0.1 s
    code, out, err = run_cli(["analyze", run, "--format", "json"], capsys)
    assert code == 0, err
    assert any("less than its steps" in line and "run.json" in line for line in lines_starting(err, "warning:"))
    epoch = json.loads(out)["epochs"][0]
    assert epoch["epoch_level_s"] == 0 and all(0 <= v <= 100 for k, v in epoch.items() if k.endswith("_pct"))


BAD_RUN_JSON = {
    "text_numbers": (lambda m: [e.update(images="1000") for e in m["epochs"]], "'images'"),
    "device_string": (lambda m: m.update(device="cpu"), "'device' must be an object"),
    "negative_images": (lambda m: [e.update(images=-4340) for e in m["epochs"]], "'images'"),
    "absurd_images": (lambda m: [e.update(images=1e30) for e in m["epochs"]], "'images'"),
    "nan_images": (lambda m: [e.update(images=float("nan")) for e in m["epochs"]], "'images'"),
    "text_batch": (lambda m: m["config"].update(batch_size="100"), "'config.batch_size'"),
    "peak_string": (lambda m: m.update(peak="fast"), "'peak' must be an object"),
    "peak_text_rate": (
        lambda m: m.update(peak={"peak_flops_per_second": {"float32": "4e11"}}),
        "peak_flops_per_second.float32 '4e11'",
    ),
    "peak_absurd_rate": (
        lambda m: m.update(
            peak={
                "peak_flops_per_second": {"float32": 1e300},
                "ceilings": {"float32": {"matrix_flops_per_second": 1e300}},
            }
        ),
        "peak_flops_per_second.float32 1e+300",
    ),
    "peak_rates_not_an_object": (
        lambda m: m.update(peak={"peak_flops_per_second": [4e11], "ceilings": "x"}),
        "peak_flops_per_second [400000000000.0], ceilings 'x'",
    ),
}


# ---------------------------------------------------------------- run.json checked by one reader


@pytest.mark.parametrize("name", sorted(BAD_RUN_JSON))
def test_compare_and_analyze_name_a_bad_run_json_field(tmp_path, capsys, name):
    change, field = BAD_RUN_JSON[name]
    bad = edit_run_json(make_compare_run(tmp_path, "bad"), change)
    good = make_compare_run(tmp_path, "good", epoch_seconds=(3.0, 1.0, 1.0))
    code, out, err = run_cli(["compare", bad, good, "--format", "json"], capsys)
    assert code == 0, err
    warnings = [line for line in lines_starting(err, "warning:") if field in line]
    assert len(warnings) == 1 and "bad/run.json" in warnings[0], err
    rows = {row["run"]: row for row in json.loads(out)["rows"]}
    for row in rows.values():
        for key in ("images_per_second", "epoch_images_per_second", "speedup"):
            assert row[key] is None or 0 < row[key] < 1e6, (key, row[key])
    assert 0.5 < rows["bad"]["speedup"] / rows["good"]["speedup"] < 3  # 1 s against 0.6 s per epoch
    if name.startswith("peak"):  # nothing usable is left of the peak: no MFU, rather than 0 % of 1e300
        assert rows["bad"]["mfu_pct"] is None and rows["bad"]["peak_flops_per_second"] is None, rows["bad"]
    code, out, err = run_cli(["analyze", bad, "--format", "json"], capsys)
    assert code == 0 and "Traceback" not in err
    assert len([line for line in lines_starting(err, "warning:") if field in line]) == 1, err
    if name.startswith("peak"):
        assert (json.loads(out)["roofline"] or {}).get("ceilings") is None


def test_epochs_of_zero_seconds_are_named_not_an_internal_error(tmp_path, capsys):
    zero = edit_run_json(make_compare_run(tmp_path, "zero"), lambda m: [e.update(seconds=0) for e in m["epochs"]])
    good = make_compare_run(tmp_path, "good")
    code, out, err = run_cli(["compare", zero, good], capsys)
    assert code == 0 and "Assertion" not in err and "Traceback" not in err
    assert any("zero/run.json" in line and "'seconds'" in line for line in lines_starting(err, "warning:")), err
    assert any(line.startswith("warning: skipped") and "zero" in line for line in err.splitlines()), err
    code, out, err = run_cli(["compare", zero], capsys)
    assert code == 2 and lines_starting(err, "error:")[0].count("zero/run.json") == 1, err
    code, out, err = run_cli(["analyze", zero], capsys)
    assert code == 0 and "verdict:" in out and "zero/run.json" in err


def test_an_epoch_listed_twice_is_named_not_a_pandas_error(tmp_path, capsys):
    twice = edit_run_json(make_compare_run(tmp_path, "twice"), lambda m: m["epochs"][1].update(epoch=1))
    for argv in (["compare", twice, make_compare_run(tmp_path, "good")], ["analyze", twice]):
        code, out, err = run_cli(argv, capsys)
        assert code == 0 and "reindex" not in err, err
        assert any(
            "twice/run.json: epoch 1 is listed more than once" in line for line in lines_starting(err, "warning:")
        ), err


# ---------------------------------------------------------------- a run still running, or left running by a process that is gone


def test_a_run_still_running_says_so(tmp_path, capsys):
    run = edit_run_json(make_compare_run(tmp_path, "live"), lambda m: m.update(status="running"))
    code, out, err = run_cli(["analyze", run], capsys)
    assert code == 0 and "note: the run is still running" in out and "steps written so far" in out
    document = json.loads(pipeline.analyze(run).render("json"))
    assert any("still running" in note for note in document["notes"])
    done = pipeline.analyze(make_compare_run(tmp_path, "done"))
    assert not any("still running" in note for note in done.notes)


def test_a_run_left_at_running_by_a_dead_process_says_how_it_ended(tmp_path, capsys, monkeypatch):
    """run.json `running` with a crash.log, or with its pid gone (or reused) on this host, is a run
    that ended unrecorded; a live pid, or another host's, may still be running."""
    import socket

    import psutil

    from analysis.read import run_files

    host = socket.gethostname()
    unused = max(psutil.pids()) + 1000
    while psutil.pid_exists(unused):
        unused += 1
    me, my_start = os.getpid(), psutil.Process().create_time()
    cases = {
        "crashed": (
            {"pid": me, "start_time_s": my_start},
            host,
            "Fatal Python error: Segmentation fault\n\nstack\n",
            "its process crashed (Fatal Python error: Segmentation fault; every thread's stack is in crash.log)",
        ),
        "gone": (
            {"pid": unused, "start_time_s": my_start},
            host,
            None,
            f"its process (pid {unused} on this host) is gone",
        ),
        "reused": (
            {"pid": me, "start_time_s": my_start - 60},
            host,
            None,
            f"its process (pid {me} on this host) is gone",
        ),
        "alive": ({"pid": me, "start_time_s": my_start + 1}, host, "", None),
        "elsewhere": ({"pid": unused, "start_time_s": my_start}, host + "-other", None, None),
        "no_pid": ({"start_time_s": my_start}, host, None, None),
    }
    for name, (fields, on_host, crash_log, says) in cases.items():
        run = edit_run_json(
            make_compare_run(tmp_path, name),
            lambda m: (m.update(status="running", **fields), m.setdefault("device", {}).update(host=on_host)),
        )
        if crash_log is not None:
            (run / "crash.log").write_text(crash_log)
        lost = run_files.RunRecord.read(run / "run.json").ended_unrecorded
        assert (lost is None) == (says is None) and (says is None or (lost is not None and lost.startswith(says))), (
            name,
            lost,
        )
        code, out, err = run_cli(["analyze", run], capsys)
        assert code == 0, err
        assert ("still running" in out) == (says is None), (name, out)
        assert (says is None) or f"the run ended without recording its end (run.json status 'running'): {says}" in out
    finished = edit_run_json(make_compare_run(tmp_path, "complete"), lambda m: m.update(pid=unused))
    assert run_files.RunRecord.read(finished / "run.json").ended_unrecorded is None
