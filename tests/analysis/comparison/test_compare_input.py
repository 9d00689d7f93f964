"""compare and analyze on imperfect input: folders that are not runs, bad CSV cells, garbage rows,
a truncated trace, mixed image counts on the chart, the format from the output's extension."""

from __future__ import annotations

import json

import pytest

from analysis import comparison as compare
from analysis.comparison.chart import chart_data
from compare_fixtures import SEED_TABLE, make_run
from compare_fixtures import make_run as make_compare_run
from profiler import cli
from run_fixtures import make_run as make_small_run
from run_fixtures import step_line


def test_compare_skips_folders_that_are_not_runs_with_one_note(tmp_path, capsys):
    make_run(tmp_path, "a")
    make_run(tmp_path, "b", epoch_seconds=(2.0, 0.9, 0.9))
    (tmp_path / "captures" / "plugins").mkdir(parents=True)
    assert (
        cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "captures"), "--format", "json"])
        == 0
    )
    captured = capsys.readouterr()
    assert [r["run"] for r in json.loads(captured.out)["rows"]] == ["a", "b"]
    notes = [line for line in captured.err.splitlines() if "not a run directory" in line]
    assert len(notes) == 1 and notes[0].startswith("warning: skipped 1 folder") and "captures" in notes[0]
    # nothing but non-runs is still an error
    assert cli.main(["compare", str(tmp_path / "captures")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("cell, shown", [("inf", "'inf'"), ("0", "'0'"), ("-3", "'-3'"), ("", "nothing")])
def test_external_seconds_must_be_finite_and_positive(tmp_path, capsys, cell, shown):
    csv = tmp_path / "ext.csv"
    csv.write_text(f"device,seconds_per_epoch\nA,10\nB,{cell}\n")
    assert cli.main(["compare", "--external", str(csv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {csv}, line 3: seconds_per_epoch must be a finite positive number, got {shown}"]


def test_garbage_rows_in_steps_csv_are_skipped_with_a_warning_in_both_commands(tmp_path, capsys):
    good = [step_line(i, input_ms=1.0, call_ms=4.0, other_ms=0.0) for i in range(10)]
    run = make_small_run(
        tmp_path / "run", good[:5] + ["1,5,1,1700000000.05,,4.0,0.0,5.0,100", "1,6,1,garbage,1.0,4.0,0.0"] + good[5:]
    )
    for argv in (["analyze", str(run), "--format", "json"], ["compare", str(run), "--format", "json"]):
        assert cli.main(argv) == 0
        captured = capsys.readouterr()
        warnings = [line for line in captured.err.splitlines() if line.startswith("warning:") and "steps.csv" in line]
        assert warnings == [f"warning: {run / 'steps.csv'}: skipped 2 of 12 rows that do not parse"]
    # the remaining rows are exact: input is 1 of 5 ms per step
    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["mean"]["input_pct"] == pytest.approx(20.0)


@pytest.mark.slow
def test_a_truncated_trace_is_named_not_hidden(tmp_path, capsys):
    import trace_fixtures as fx

    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(8)])
    session = run / "plugins" / "profile" / "2026_01_01_00_00_00"
    session.mkdir(parents=True)
    source = fx.find_xplane(fx.trace_logdir("clean"))
    data = source.read_bytes()
    (session / "host.xplane.pb").write_bytes(data[: len(data) // 3])  # cut short, as a full disk leaves it
    assert cli.main(["analyze", str(run), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step_source"] == "steps_csv"
    assert any("truncated or corrupt" in note for note in result["notes"])
    assert cli.main(["analyze", str(run)]) == 0
    assert "truncated or corrupt" in capsys.readouterr().out


def test_chart_is_per_image_when_runs_train_different_image_counts(tmp_path):
    small = make_run(tmp_path, "small", epoch_seconds=(2.0, 3.0, 3.0), steps=20, images=100)  # 2,000 images
    table = compare.compare_runs([small], [SEED_TABLE])
    data, unit = chart_data(table)
    assert unit == "ms per image"
    by_run = dict(zip(table["run"], data["total"]))
    assert by_run["small"] == pytest.approx(1.5)  # 3 s / 2000 images
    assert by_run["GTX 1080 Ti"] == pytest.approx(0.08)  # 4 s / 50000 images: faster, as it is
    assert by_run["small"] > by_run["GTX 1080 Ti"]
    assert "2,000 images/epoch" in data.set_index(table["run"]).loc["small", "label"]
    same = compare.compare_runs([], [SEED_TABLE])
    assert chart_data(same)[1] == "seconds per epoch"


@pytest.mark.parametrize(
    "name, check",
    [
        ("compare.md", lambda text: text.startswith("# devprof compare")),
        ("compare.json", lambda text: json.loads(text)["schema_version"] == 1),
        ("compare.csv", lambda text: text.splitlines()[0].startswith("run,")),
        ("compare.txt", lambda text: "why:" in text),
    ],
)
def test_output_format_follows_the_extension(tmp_path, capsys, name, check):
    out = tmp_path / name
    assert cli.main(["compare", "--external", str(SEED_TABLE), "-o", str(out)]) == 0
    assert check(out.read_text())
    assert (tmp_path / name).with_suffix(".png").is_file()
    # an explicit --format wins
    explicit = tmp_path / ("explicit-" + name)
    assert cli.main(["compare", "--external", str(SEED_TABLE), "-o", str(explicit), "--format", "text"]) == 0
    assert "why:" in explicit.read_text()


def test_a_multi_worker_run_is_one_row_with_its_workers_as_sub_rows(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    (job / "run.json").write_text(json.dumps({"status": "complete", "workers": ["worker-0", "worker-1"]}))
    make_run(job, "worker-0", epoch_seconds=(2.0, 0.6, 0.6))
    make_run(job, "worker-1", epoch_seconds=(2.0, 0.6, 0.6), input_ms=11.0)
    single = make_run(tmp_path, "single", epoch_seconds=(2.0, 1.2, 1.2))
    assert cli.main(["compare", str(job), str(single), "--format", "json"]) == 0
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert set(rows) == {"job", "single"}
    assert rows["job"]["seconds_per_epoch"] == pytest.approx(0.6)  # the chief's, the job's pace
    workers = rows["job"]["workers"]
    assert [w["run"] for w in workers] == ["worker-0", "worker-1"]
    assert workers[1]["input_pct"] > workers[0]["input_pct"]
    assert rows["single"]["workers"] == []
    assert cli.main(["compare", str(job), str(single)]) == 0
    assert "job / worker-1:" in capsys.readouterr().out


def test_gap_shares_stay_within_0_and_100_percent(tmp_path, capsys):
    """compute costs 1.2 ms/image more, input 0.3 ms/image less: compute explains all of what got
    slower (not 133 % of the 0.9 ms/image net gap), and the part that got faster is named."""
    fast = make_run(tmp_path, "fast", input_ms=40.0, call_ms=50.0, other_ms=0.0, epoch_seconds=(2.0, 0.9, 0.9))
    slow = make_run(tmp_path, "slow", input_ms=10.0, call_ms=170.0, other_ms=0.0, epoch_seconds=(2.0, 1.8, 1.8))
    assert cli.main(["compare", str(fast), str(slow), "--format", "json"]) == 0
    why = {r["run"]: r["why"] for r in json.loads(capsys.readouterr().out)["rows"]}["slow"]
    assert "compute explains 100 % of the" in why, why
    assert "input 0.3 ms/image faster" in why, why


def test_identical_runs_have_no_gap_and_no_advice(tmp_path, capsys):
    a = make_run(tmp_path, "a")
    b = make_run(tmp_path, "b")
    assert cli.main(["compare", str(a), str(b), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    slower = next(r for r in rows if not r["fastest"])
    assert slower["why"].endswith("no gap to explain"), slower["why"]
    assert "nan" not in slower["why"] and "prefetch" not in slower["why"]


def test_compare_does_not_tell_a_prefetching_pipeline_to_prefetch():
    row = {"input_pct": 30.0, "compute_pct": 60.0, "host_pct": 10.0, "prefetches": True}
    assert ".prefetch(" not in compare.advice(row, "input")
    assert ".prefetch(" in compare.advice({**row, "prefetches": None}, "input")


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


# ---------------------------------------------------------------- a run given twice, runs of different sizes


def test_a_run_given_twice_is_shown_once(tmp_path, capsys, monkeypatch):
    base = make_compare_run(tmp_path, "base")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["compare", base, "base/", "--format", "json"], capsys)
    assert code == 0, err
    assert [row["run"] for row in json.loads(out)["rows"]] == ["base"]
    warnings = lines_starting(err, "warning:")
    assert len(warnings) == 1 and "twice" in warnings[0], err


def test_runs_of_different_sizes_are_explained_per_training_image(tmp_path):
    """A 2,000-image run with 30 ms more input per batch of 100 against a 50,000-image run, both
    validating 1,000 images (0.5 s): the input explains the gap, and the sentence gives the
    table's speed-up."""
    small = make_compare_run(
        tmp_path,
        "small",
        device="Small",
        steps=20,
        input_ms=31.0,
        epoch_seconds=(2.0, 20 * 0.085 + 0.5, 20 * 0.085 + 0.5),
    )
    big = make_compare_run(
        tmp_path, "big", device="Big", steps=500, epoch_seconds=(40.0, 500 * 0.055 + 0.5, 500 * 0.055 + 0.5)
    )
    table = compare.compare_runs([small, big])
    why = dict(zip(table["run"], table["why"]))["small"]
    assert "input explains 100 % of the 0.3 ms/image gap of training" in why, why
    assert "epoch-level work is apart" in why and "0.5 vs 0.5 s per epoch" in why, why
    speedups = dict(zip(table["run"], table["speedup"]))
    shown = speedups["big"] / speedups["small"]
    assert f"{shown:.2f}x slower than Big" in why, (why, shown)
