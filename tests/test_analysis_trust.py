"""analyze and compare on hostile or odd input: formula text in CSVs, `|` in Markdown, a folder that
cannot be written, duplicated steps, bad run.json fields, long steps.csv and kernel names, a
run still training, hosts that share no collective, a run given twice, one worker, runs of
different sizes, a busy machine, and bfloat16 without matrix units. Fast: hand-written run
directories and synthetic traces, no TensorFlow."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import comparison as compare
from analysis import pipeline
from analysis.breakdown import workers
from analysis.rules import straggler as straggler_rule
from analysis.render import markdown
from profiler import cli
from compare_fixtures import make_run as make_compare_run
from run_fixtures import HEADER, step_line
from run_fixtures import make_run as make_small_run


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def device_trace(tmp_path_factory):
    return fx.write_synthetic_device_trace(tmp_path_factory.mktemp("gpu") / "plugins/profile/s/h.xplane.pb",
                                           gpus=2, empty_gpus=0)


# ---------------------------------------------------------------- 2. formula text in every CSV


FORMULA = '=HYPERLINK("evil.example","click")'


def test_analyze_output_csvs_quote_formula_text(device_trace, tmp_path):
    result = pipeline.analyze(device_trace.path)
    ops = result.ops.copy()
    ops.loc[0, "op"] = FORMULA
    ops.loc[1, "type"] = "@SUM(A1)"
    rec = pd.DataFrame({"step": [1], "note": ["-cmd"], "step_ms_diff": [-1.5]})
    run = pipeline.analyze(make_small_run(tmp_path / "run", [step_line(i) for i in range(6)]))
    epochs = run.epochs.assign(label="+x")
    steps = result.steps.copy()
    steps["name"] = "=1+2"
    hostile = dataclasses.replace(result, ops=ops, reconciliation=rec, epochs=epochs, steps=steps)
    out = tmp_path / "out"
    written = pipeline.Analysis.write(hostile, out)
    for name in ("ops.csv", "trace_vs_steps.csv", "epoch_breakdown.csv", "step_breakdown.csv"):
        assert out / name in written
    assert pd.read_csv(out / "ops.csv")["op"][0] == "'" + FORMULA
    assert pd.read_csv(out / "ops.csv")["type"][1] == "'@SUM(A1)"
    reconciled = pd.read_csv(out / "trace_vs_steps.csv")
    assert reconciled["note"][0] == "'-cmd" and reconciled["step_ms_diff"][0] == -1.5  # numbers stay numbers
    assert pd.read_csv(out / "epoch_breakdown.csv")["label"][0] == "'+x"
    assert set(pd.read_csv(out / "step_breakdown.csv")["name"]) == {"'=1+2"}
    assert set(pd.read_csv(io.StringIO(hostile.render("csv")))["name"]) == {"'=1+2"}


def test_compare_csv_quotes_run_path_label_why_and_external_notes(tmp_path, capsys):
    evil = make_compare_run(tmp_path, FORMULA, device="-cmd")
    make_compare_run(tmp_path, "base", device="Test CPU", epoch_seconds=(3.0, 1.0, 1.0))
    external = tmp_path / "ext.csv"
    external.write_text("device,seconds_per_epoch,notes\n@dev,2.0,=1+2\n")
    code, out, err = run_cli(["compare", evil, tmp_path / "base", "--external", external, "--format", "csv"], capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    row = table[table["run"].str.contains("HYPERLINK")].iloc[0]
    assert row["run"] == "'" + FORMULA
    assert row["label"] == "'-cmd" and row["device"] == "'-cmd" and row["why"].startswith("'-cmd")
    ext = table[table["external"]].iloc[0]
    assert ext["notes"] == "'=1+2" and ext["run"] == "'@dev"
    for cell in map(str, table.select_dtypes(exclude="number").stack()):
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    assert table["seconds_per_epoch"].dtype.kind == "f"


def test_compare_csv_quotes_a_path_that_starts_like_a_formula(tmp_path, capsys, monkeypatch):
    make_compare_run(tmp_path, "-run")
    make_compare_run(tmp_path, "b", epoch_seconds=(3.0, 1.0, 1.0))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["compare", "--format", "csv", "--", "-run", "b"], capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    assert "'-run" in set(table["path"]) and "'-run" in set(table["run"])


# ---------------------------------------------------------------- 3. Markdown tables


def test_markdown_cells_escape_pipes_and_newlines():
    frame = pd.DataFrame({"op": ["a|b", "line1\nline2", "c\\|d"], "ms": [1.0, 2.0, 3.0]})
    lines = markdown.markdown_table(frame).splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per row
    assert lines[2] == "| a\\|b | 1.0 |"
    assert lines[3] == "| line1<br>line2 | 2.0 |"
    assert lines[4] == "| c\\\\\\|d | 3.0 |"
    for line in lines[2:]:
        assert line.replace("\\\\", "").replace("\\|", "").count("|") == 3, line


# ---------------------------------------------------------------- 4. a folder that cannot be written


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


# ---------------------------------------------------------------- 13, 16, 20: workers and the straggler


def independent_session(folder: Path) -> Path:
    """Two host traces in one session that share nothing: no collective, one host twice as slow."""
    session = folder / "plugins" / "profile" / "2030_01_01_00_00_00"
    base = dict(gpus=1, steps=6, h2d_ms=1.5, d2d_ms=0.5, collective_ms=0.0, gap_ms=2.0, skew_ms=0.0, empty_gpus=0,
                custom_plane=False)
    fx.write_synthetic_device_trace(session / "hostA.xplane.pb", kernel_ms=6.0, hostname="hostA", **base)
    fx.write_synthetic_device_trace(session / "hostB.xplane.pb", kernel_ms=14.0, hostname="hostB", **base)
    return folder


def test_hosts_without_a_shared_collective_have_no_straggler(tmp_path, capsys):
    logdir = independent_session(tmp_path / "logs")
    result = pipeline.analyze(logdir)
    assert len(result.workers) == 2
    assert result.straggler is None
    assert "independent" in result.straggler_reason
    code, out, _ = run_cli(["analyze", logdir], capsys)
    assert code == 0
    line = lines_starting(out, "straggler:")
    assert line == [f"straggler: none ({result.straggler_reason})"], out
    assert "wait for it in the collective" not in out
    document = json.loads(result.render("json"))
    assert document["straggler"] is None and "independent" in document["straggler_reason"]


def one_worker_job(tmp_path: Path, trace: Path) -> Path:
    job = tmp_path / "job"
    worker = job / "worker-0"
    (worker / "plugins" / "profile" / "s").mkdir(parents=True)
    (job / "run.json").write_text(json.dumps({"status": "complete", "workers": ["worker-0"], "num_workers": 1}))
    (worker / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "gpu", "host": "node-0"}}))
    shutil.copy(trace, worker / "plugins" / "profile" / "s" / "host.xplane.pb")
    return job


def test_a_one_worker_job_has_no_worker_note_and_no_straggler_line(tmp_path, capsys, device_trace):
    job = one_worker_job(tmp_path, device_trace.path)
    code, out, err = run_cli(["analyze", job], capsys)
    assert code == 0, err
    assert "1 workers" not in out and "straggler" not in out, out
    report = (job / "analysis" / "report.md").read_text()
    assert "1 workers" not in report and "Straggler" not in report
    document = json.loads(pipeline.analyze(job).render("json"))
    assert document["straggler"] is None and document["straggler_reason"] is None


def row(worker, own_ms, collective_ms=2.0, part="compute", noise=1.0, steps=10, cpu=math.nan):
    mean = {"step_ms": own_ms + collective_ms, "input_ms": 1.0, "compute_ms": own_ms - 2.0, "host_ms": 1.0,
            "collective_ms": collective_ms}
    if part != "compute":
        mean["compute_ms"] = 10.0
        mean[f"{part}_ms"] = own_ms - 11.0
    result = workers.worker_row(worker, f"node-{worker}", mean, None, cpu)
    result.update(steps_used=steps, own_noise_ms=noise, **{f"{p}_noise_ms": noise for p in workers.CAUSES})
    return result


def test_a_straggler_must_stand_out_of_the_step_to_step_noise():
    quiet = [row(0, 100.0, 20.0), row(1, 115.0)]
    straggler, reason = straggler_rule.find_straggler(pd.DataFrame(quiet))
    assert straggler["worker"] == 1 and reason is None
    noisy = [row(0, 100.0, 20.0, noise=30.0), row(1, 115.0, noise=30.0)]  # 15 % above, noise 30 ms
    straggler, reason = straggler_rule.find_straggler(pd.DataFrame(noisy))
    assert straggler is None
    assert "no worker stands out" in reason and "noise (30.0 ms)" in reason and "15 %" in reason
    injected = [row(0, 100.0, 42.0, noise=30.0), row(1, 140.0, part="host", noise=30.0)]  # 40 ms of host work
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(injected))
    assert straggler["worker"] == 1 and straggler["cause"] == "host"


def test_a_worker_slowed_by_other_processes_is_a_contention_straggler():
    busy = [row(0, 100.0, 40.0, cpu=160.0), row(1, 140.0, cpu=110.0)]
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(busy), other_cpu_pct=45.0)
    assert straggler["worker"] == 1 and straggler["cause"] == "contention"
    assert "45 %" in straggler["evidence"] and "110 % CPU" in straggler["evidence"]
    # Host work that keeps its process busy is its own cause, also on a busy machine.
    host_work = [row(0, 100.0, 40.0, cpu=110.0), row(1, 140.0, part="host", cpu=160.0)]
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(host_work), other_cpu_pct=45.0)
    assert straggler["cause"] == "host"
    # A quiet machine: less CPU is not contention.
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(busy), other_cpu_pct=2.0)
    assert straggler["cause"] == "compute"
    # A worker waiting 40 ms a step for its data uses less CPU on a busy machine too: its compute is
    # the others', so the cause is its input (a two-worker job with injected input read contention).
    waiting = [row(0, 100.0, 40.0, part="input", cpu=160.0), row(1, 140.0, part="input", cpu=110.0)]
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(waiting), other_cpu_pct=45.0)
    assert straggler["worker"] == 1 and straggler["cause"] == "input", straggler
    # ... unless its compute, which needs the CPU, is slow as well: then it was starved.
    starved = pd.DataFrame(waiting)
    starved.loc[1, "compute_ms"] += 20.0
    starved.loc[1, "step_ms"] += 20.0
    straggler, _ = straggler_rule.find_straggler(starved, other_cpu_pct=45.0)
    assert straggler["worker"] == 1 and straggler["cause"] == "contention", straggler


def test_too_few_steps_to_tell_is_said_plainly():
    straggler, reason = straggler_rule.find_straggler(pd.DataFrame([row(0, 100.0, 40.0, steps=2), row(1, 140.0, steps=2)]))
    assert straggler is None and "too few steps to tell" in reason and "--profile-steps" in reason


def test_a_session_with_few_steps_says_so(tmp_path):
    session = fx.write_synthetic_session(tmp_path / "s", workers=2, slow_worker=1, slow_part="host", steps=2)
    result = pipeline.analyze(session.logdir)
    assert result.straggler is None and "too few steps" in result.straggler_reason
    assert "straggler: none (too few steps" in result.render("text")


# ---------------------------------------------------------------- 5. steps.csv rows twice or out of order


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
    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(10)],
                         epochs=[{"epoch": 1, "seconds": 0.05, "images": 1000}])  # the steps take 0.1 s
    code, out, err = run_cli(["analyze", run, "--format", "json"], capsys)
    assert code == 0, err
    assert any("less than its steps" in line and "run.json" in line for line in lines_starting(err, "warning:"))
    epoch = json.loads(out)["epochs"][0]
    assert epoch["epoch_level_s"] == 0 and all(0 <= v <= 100 for k, v in epoch.items() if k.endswith("_pct"))


def test_renderers_refuse_a_negative_time_or_a_share_over_100(tmp_path):
    run = make_small_run(tmp_path / "run", [step_line(i) for i in range(6)])
    result = pipeline.analyze(run)
    steps = result.steps.copy()
    steps.loc[2, "host_ms"] = -3.0
    broken = dataclasses.replace(result, steps=steps)
    for fmt in ("text", "markdown", "json"):
        with pytest.raises(ValueError, match="negative"):
            broken.render(fmt)
    shares = result.steps.copy()
    shares.loc[1, "input_pct"] = 178.0
    with pytest.raises(ValueError, match="over 100"):
        dataclasses.replace(result, steps=shares).render("text")


# ---------------------------------------------------------------- 6, 7. run.json checked by one reader


def edit_run_json(run: Path, change) -> Path:
    meta = json.loads((run / "run.json").read_text())
    change(meta)
    (run / "run.json").write_text(json.dumps(meta))
    return run


BAD_RUN_JSON = {
    "text_numbers": (lambda m: [e.update(images="1000") for e in m["epochs"]], "'images'"),
    "device_string": (lambda m: m.update(device="cpu"), "'device' must be an object"),
    "negative_images": (lambda m: [e.update(images=-4340) for e in m["epochs"]], "'images'"),
    "absurd_images": (lambda m: [e.update(images=1e30) for e in m["epochs"]], "'images'"),
    "nan_images": (lambda m: [e.update(images=float("nan")) for e in m["epochs"]], "'images'"),
    "text_batch": (lambda m: m["config"].update(batch_size="100"), "'config.batch_size'"),
    "peak_string": (lambda m: m.update(peak="fast"), "'peak' must be an object"),
    "peak_text_rate": (lambda m: m.update(peak={"peak_flops_per_second": {"float32": "4e11"}}),
                       "peak_flops_per_second.float32 '4e11'"),
    "peak_absurd_rate": (lambda m: m.update(peak={"peak_flops_per_second": {"float32": 1e300},
                                                  "ceilings": {"float32": {"matrix_flops_per_second": 1e300}}}),
                         "peak_flops_per_second.float32 1e+300"),
    "peak_rates_not_an_object": (lambda m: m.update(peak={"peak_flops_per_second": [4e11], "ceilings": "x"}),
                                 "peak_flops_per_second [400000000000.0], ceilings 'x'"),
}


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
        assert any("twice/run.json: epoch 1 is listed more than once" in line
                   for line in lines_starting(err, "warning:")), err


# ---------------------------------------------------------------- 11, 14, 21


def test_a_run_still_running_says_so(tmp_path, capsys):
    run = edit_run_json(make_compare_run(tmp_path, "live"), lambda m: m.update(status="running"))
    code, out, err = run_cli(["analyze", run], capsys)
    assert code == 0 and "note: the run is still running" in out and "steps written so far" in out
    document = json.loads(pipeline.analyze(run).render("json"))
    assert any("still running" in note for note in document["notes"])
    done = pipeline.analyze(make_compare_run(tmp_path, "done"))
    assert not any("still running" in note for note in done.notes)


def test_a_run_given_twice_is_shown_once(tmp_path, capsys, monkeypatch):
    base = make_compare_run(tmp_path, "base")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["compare", base, "base/", "--format", "json"], capsys)
    assert code == 0, err
    assert [row["run"] for row in json.loads(out)["rows"]] == ["base"]
    warnings = lines_starting(err, "warning:")
    assert len(warnings) == 1 and "twice" in warnings[0], err


def test_bfloat16_on_a_cpu_that_emulates_it_is_a_finding_in_analyze_and_compare(tmp_path):
    def device(units):
        return lambda m: m["device"].update(bfloat16_units=units)

    emulated = edit_run_json(make_compare_run(tmp_path, "emulated", precision="mixed_bfloat16"), device([]))
    native = edit_run_json(make_compare_run(tmp_path, "native", precision="mixed_bfloat16"), device(["amx_bf16"]))
    unknown = edit_run_json(make_compare_run(tmp_path, "unknown", precision="mixed_bfloat16"), device(None))
    found = pipeline.analyze(emulated).findings
    assert [f["rule"] for f in found] == ["bf16_without_matrix_units"]
    assert found[0]["severity"] == "warning" and "--precision float32" in found[0]["advice"]
    assert "emulated" in found[0]["evidence"]
    for other in (native, unknown):
        assert "bf16_without_matrix_units" not in [f["rule"] for f in pipeline.analyze(other).findings]
    table = compare.compare_runs([emulated, native])
    rules_found = dict(zip(table["run"], table["findings"]))
    assert [f["rule"] for f in rules_found["emulated"]] == ["bf16_without_matrix_units"]
    assert rules_found["native"] == []


# ---------------------------------------------------------------- 19. runs of different sizes


def test_runs_of_different_sizes_are_explained_per_training_image(tmp_path):
    """A 2,000-image run with 30 ms more input per batch of 100 against a 50,000-image run, both
    validating 1,000 images (0.5 s): the input explains the gap, and the sentence gives the
    table's speed-up."""
    small = make_compare_run(tmp_path, "small", device="Small", steps=20, input_ms=31.0,
                             epoch_seconds=(2.0, 20 * 0.085 + 0.5, 20 * 0.085 + 0.5))
    big = make_compare_run(tmp_path, "big", device="Big", steps=500, epoch_seconds=(40.0, 500 * 0.055 + 0.5,
                                                                                 500 * 0.055 + 0.5))
    table = compare.compare_runs([small, big])
    why = dict(zip(table["run"], table["why"]))["small"]
    assert "input explains 100 % of the 0.3 ms/image gap of training" in why, why
    assert "epoch-level work is apart" in why and "0.5 vs 0.5 s per epoch" in why, why
    speedups = dict(zip(table["run"], table["speedup"]))
    shown = speedups["big"] / speedups["small"]
    assert f"{shown:.2f}x slower than Big" in why, (why, shown)


# ---------------------------------------------------------------- 8. long steps.csv, long kernel names


LONG_KERNEL = ("void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<"
               + "Eigen::TensorMap<Eigen::Tensor<float, 4, 1, long>, 16, Eigen::MakePointer>, " * 14
               + "Eigen::GpuDevice>, long>>(Eigen::TensorEvaluator<" + "const float, " * 20 + "long>, long)")


def test_text_shows_at_most_20_steps_and_short_kernel_names(tmp_path, capsys):
    assert len(LONG_KERNEL) > 1200
    trace = fx.write_synthetic_device_trace(tmp_path / "plugins/profile/s/h.xplane.pb", gpus=1, empty_gpus=0,
                                            steps=81, kernel_name=LONG_KERNEL)
    code, out, err = run_cli(["analyze", trace.path, "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 200, max(lines, key=len)
    header = next(i for i, line in enumerate(lines) if line.startswith(" step "))
    rows = [line for line in lines[header + 1:header + 30] if line.strip()[:1].isdigit()]
    assert len(rows) == 20, lines[header:header + 25]
    assert "… 61 more steps in --format json / step_breakdown.csv" in out
    assert "EigenMetaKernel<…>(…)" in out
    document = json.loads(pipeline.analyze(trace.path).render("json"))
    assert len(document["steps"]) == 81 and LONG_KERNEL in {op["op"] for op in document["ops"]}
    assert LONG_KERNEL in set(pd.read_csv(tmp_path / "out" / "ops.csv")["op"])
    assert len(pd.read_csv(tmp_path / "out" / "step_breakdown.csv")) == 81


def test_a_long_steps_csv_is_read_whole_and_printed_short(tmp_path, capsys):
    rows = 100_000
    run = tmp_path / "run"
    run.mkdir()
    frame = pd.DataFrame({"epoch": 1 + pd.RangeIndex(rows) // 1000, "step": pd.RangeIndex(rows), "steps": 1,
                          "start_time_s": 1.7e9 + 0.01 * pd.RangeIndex(rows), "input_ms": 1.0, "call_ms": 8.0,
                          "other_host_ms": 1.0, "step_ms": 10.0, "images": 100, "extra_column": "x"})
    frame.to_csv(run / "steps.csv", index=False)
    (run / "run.json").write_text(json.dumps({"status": "complete", "device": {"kind": "cpu"},
                                              "epochs": [{"epoch": e, "seconds": 10.5, "images": 100_000}
                                                         for e in range(1, 101)]}))
    code, out, err = run_cli(["analyze", run, "--out", tmp_path / "out"], capsys)
    assert code == 0 and not lines_starting(err, "warning:"), err
    assert len(out.splitlines()) < 200
    assert f"… {rows - 20} more steps" in out
    assert len(pd.read_csv(tmp_path / "out" / "step_breakdown.csv")) == rows
    assert len(pd.read_csv(tmp_path / "out" / "epoch_breakdown.csv")) == 100


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
        "crashed": ({"pid": me, "start_time_s": my_start}, host, "Fatal Python error: Segmentation fault\n\nstack\n",
                    "its process crashed (Fatal Python error: Segmentation fault; every thread's stack is in crash.log)"),
        "gone": ({"pid": unused, "start_time_s": my_start}, host, None, f"its process (pid {unused} on this host) is gone"),
        "reused": ({"pid": me, "start_time_s": my_start - 60}, host, None, f"its process (pid {me} on this host) is gone"),
        "alive": ({"pid": me, "start_time_s": my_start + 1}, host, "", None),
        "elsewhere": ({"pid": unused, "start_time_s": my_start}, host + "-other", None, None),
        "no_pid": ({"start_time_s": my_start}, host, None, None),
    }
    for name, (fields, on_host, crash_log, says) in cases.items():
        run = edit_run_json(make_compare_run(tmp_path, name),
                            lambda m: (m.update(status="running", **fields), m.setdefault("device", {}).update(host=on_host)))
        if crash_log is not None:
            (run / "crash.log").write_text(crash_log)
        lost = run_files.RunRecord.read(run / "run.json").ended_unrecorded
        assert (lost is None) == (says is None) and (says is None or lost.startswith(says)), (name, lost)
        code, out, err = run_cli(["analyze", run], capsys)
        assert code == 0, err
        assert ("still running" in out) == (says is None), (name, out)
        assert (says is None) or f"the run ended without recording its end (run.json status 'running'): {says}" in out
    finished = edit_run_json(make_compare_run(tmp_path, "complete"), lambda m: m.update(pid=unused))
    assert run_files.RunRecord.read(finished / "run.json").ended_unrecorded is None
