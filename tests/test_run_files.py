"""The run-directory contract: tolerant readers, one-line errors naming the file, and one
utilization summary shared by `analyze` and `compare`."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

from analysis.read import run_files
from analysis.read.run_files import STEPS_COLUMNS, RunFileError, RunFileWarning
from profiler import cli
from run_fixtures import HEADER, make_run, step_line


def test_steps_csv_skips_rows_that_do_not_parse_with_one_warning(tmp_path):
    good = [step_line(i) for i in range(6)]
    bad = ["1,6,1,1700000000.06,,8.0,1.0,10.0,100",  # empty cell
           "1,7,1,1700000000.07,oops,8.0,1.0,10.0,100",  # not a number
           "1,8,1,1700000000.08,inf,8.0,1.0,10.0,100",  # infinite
           "1,9,1,1700000000.09,1.0,8.0",  # too few cells
           "1,10,1,1700000000.10,-5,8.0,1.0,10.0,100"]  # negative time
    path = tmp_path / "steps.csv"
    path.write_text("\n".join([HEADER, *good[:3], *bad, *good[3:]]) + "\n" + step_line(99)[:12])  # cut-off last line
    with pytest.warns(RunFileWarning) as caught:
        frame = run_files.read_steps_csv(path)
    assert len(caught) == 1
    assert str(path) in str(caught[0].message) and "skipped 5 of" in str(caught[0].message)
    assert frame["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert frame["input_ms"].tolist() == [1.0] * 6 and frame["step"].dtype == "int64"


def test_clean_steps_csv_reads_without_warning(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("\n".join([HEADER, *(step_line(i) for i in range(3))]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(run_files.read_steps_csv(path)) == 3


@pytest.mark.parametrize("content, expected", [
    ("[1, 2, 3]", "expected a JSON object, got a list"),
    ("{\"status\": ", "not valid JSON"),
])
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
        rows.append({"time_s": float(i), "cpu_pct": system_pct, **{f"cpu{c}_pct": system_pct for c in range(cores)},
                     "proc_cpu_pct": 100.0 * proc_cores, "proc_rss_bytes": 1e8})
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
    epochs = [{"epoch": 1, "seconds": 3.0, "train_seconds": 2.5, "images": 1000, "images_per_second": 400.0},
              {"epoch": 2, "seconds": 2.0, "train_seconds": 1.6, "images": 1000, "images_per_second": 625.0}]
    run = make_run(tmp_path / "run", [step_line(i) for i in range(8)], epochs=epochs)
    assert cli.main(["compare", str(run), "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["images_per_second"] == pytest.approx(625.0)  # what run.json and the console say for epoch 2
    assert row["epoch_images_per_second"] == pytest.approx(500.0)  # 1000 images over the 2.0 s epoch


def test_epoch_result_carries_both_rates():
    from models.training import EpochResult

    result = EpochResult(epoch=1, seconds=2.0, train_seconds=1.6, images=1000, images_per_second=625.0, loss=1.0,
                         accuracy=0.5, val_loss=1.0, val_accuracy=0.5)
    record = result.as_dict()
    assert record["images_per_second"] == 625.0 and record["epoch_images_per_second"] == pytest.approx(500.0)


def test_a_multi_worker_run_directory_has_one_row_per_worker_and_names_the_straggler(tmp_path, capsys):
    import shutil

    import trace_fixtures as fx

    session = fx.write_synthetic_session(tmp_path / "session", workers=2, slow_worker=1, slow_part="host",
                                         extra_ms=8.0)
    job = tmp_path / "job"
    job.mkdir()
    (job / "run.json").write_text(json.dumps({"status": "complete", "workers": ["worker-0", "worker-1"]}))
    for index, trace in enumerate(session.files):
        worker = job / f"worker-{index}"
        worker.mkdir()
        (worker / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "gpu",
                                                                                       "host": f"node-{index}"}}))
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
