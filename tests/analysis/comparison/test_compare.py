"""`devprof compare`: hand-made run directories with known numbers, the seed table, bad input, and one real
pair of runs where an injected input delay must be named as the reason for the gap."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest

import analysis
from analysis import comparison as compare
from compare_fixtures import SEED_TABLE, make_run, run_cli
from profiler import cli
from run_fixtures import small_run


@pytest.fixture
def runs(tmp_path):
    """fast: 0.6 s/epoch; slow_input: +40 ms input per call (+0.4 s); slow_host: +30 ms Python per call."""
    fast = make_run(tmp_path, "fast", device="Test CPU")
    slow_input = make_run(tmp_path, "slow_input", device="Other CPU", input_ms=41.0, epoch_seconds=(3.0, 1.0, 1.0))
    slow_host = make_run(tmp_path, "slow_host", device="Host CPU", other_ms=34.0, epoch_seconds=(3.0, 0.9, 0.9))
    return fast, slow_input, slow_host


# ---------------------------------------------------------------- numbers from hand-made runs


def test_steady_state_is_median_of_epochs_after_first(tmp_path):
    path = make_run(tmp_path, "r", epoch_seconds=(9.0, 0.6, 0.8, 0.55))
    row = compare.run_row(compare.read_run(path))
    assert row["seconds_per_epoch"] == pytest.approx(0.6)  # median of 0.6, 0.8, 0.55; the 9 s first epoch is out
    assert row["epochs_used"] == [2, 3, 4]
    assert row["epoch_images_per_second"] == pytest.approx(1000 / 0.6)  # the whole epoch, validation included
    assert row["images_per_second"] == pytest.approx(1000 / 0.54)  # training images over training seconds
    only = compare.run_row(compare.read_run(make_run(tmp_path, "one", epoch_seconds=(0.7,))))
    assert only["seconds_per_epoch"] == pytest.approx(0.7) and only["epochs_used"] == [1]


def test_components_come_from_steps_csv_and_add_up(runs):
    row = compare.run_row(compare.read_run(runs[0]))
    # per epoch: 10 calls x (1 input + 50 call + 4 other) ms = 0.55 s of steps in a 0.6 s epoch
    assert row["input_s"] == pytest.approx(0.010)
    assert row["compute_s"] == pytest.approx(0.500)
    assert row["host_s"] == pytest.approx(0.040)
    assert row["epoch_level_s"] == pytest.approx(0.050)
    assert row["input_pct"] == pytest.approx(100 * 0.01 / 0.6)
    assert row["compute_pct"] + row["host_pct"] + row["input_pct"] + row["epoch_level_pct"] == pytest.approx(100)
    assert row["compute_source"] == "steps.csv"


def test_trace_share_splits_the_call_into_compute_and_host():
    breakdown = pd.DataFrame(
        {
            "epoch": [1, 2],
            "seconds": [1.0, 0.6],
            "input_s": [0.01, 0.01],
            "call_s": [0.5, 0.5],
            "other_host_s": [0.04, 0.04],
            "epoch_level_s": [0.45, 0.05],
        }
    )
    trace_mean = {"step_ms": 55.0, "input_ms": 1.0, "compute_ms": 22.0, "host_ms": 32.0}  # compute 40 % of a step
    parts = compare.steady_components(breakdown, [2], 0.6, trace_mean)
    assert parts["compute_s"] == pytest.approx(0.55 * 0.4)
    assert parts["host_s"] == pytest.approx(0.5 - 0.22 + 0.04)
    assert parts["input_s"] == pytest.approx(0.01)
    assert sum(parts[f"{p}_s"] for p in compare.COMPONENTS) == pytest.approx(0.6)


def test_speedup_against_slowest_and_why_names_each_gap(runs, capsys):
    code, out, err = run_cli([*runs, "--format", "json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    rows = {r["run"]: r for r in result["rows"]}
    assert result["baseline"] == "slow_input"  # the slowest by default
    assert rows["slow_input"]["speedup"] == pytest.approx(1.0)
    assert rows["fast"]["speedup"] == pytest.approx(1.0 / 0.6)
    assert rows["slow_host"]["speedup"] == pytest.approx(1.0 / 0.9)
    assert rows["fast"]["why"].startswith("Test CPU: fastest")
    # +40 ms input per call of 100 images = +0.4 ms/image, all of the gap
    assert "input explains 100 % of the 0.4 ms/image gap" in rows["slow_input"]["why"]
    assert "prefetch" in rows["slow_input"]["why"]
    assert "host overhead explains 100 % of the 0.3 ms/image gap" in rows["slow_host"]["why"]
    assert "--steps-per-execution" in rows["slow_host"]["why"]
    for row in result["rows"]:
        assert {
            "run",
            "device",
            "seconds_per_epoch",
            "images_per_second",
            "speedup",
            "input_pct",
            "compute_pct",
            "host_pct",
            "why",
            "external",
        } <= set(row)
        assert row["external"] is False and row["flags"] == []


def test_explicit_baseline_by_run_name_or_path(runs, capsys):
    code, out, _ = run_cli([*runs, "--baseline", "fast", "--format", "json"], capsys)
    assert code == 0
    rows = {r["run"]: r for r in json.loads(out)["rows"]}
    assert rows["fast"]["speedup"] == pytest.approx(1.0)
    assert rows["slow_input"]["speedup"] == pytest.approx(0.6)
    code, out, _ = run_cli([*runs, "--baseline", runs[2], "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["baseline"] == "slow_host"


def test_host_bound_advice_suggests_enough_steps_per_execution(tmp_path):
    # host 78 % and compute 22 % of a step at 1 step per call: k >= 78 * 95 / (5 * 22) = 67.4 -> 100
    assert compare.suggest_steps_per_execution(78.0, 22.0, 1, 500) == 100
    assert compare.suggest_steps_per_execution(78.0, 22.0, 1, 40) == 40  # never more than an epoch
    assert compare.suggest_steps_per_execution(10.0, 90.0, 1) == 4  # 10 * 95 / 450 = 2.1 -> 4
    row = {"steps_per_call": 1, "host_pct": 78.0, "compute_pct": 22.0, "steps_per_epoch": 500}
    assert compare.advice(row, "host") == "at 1 step per call; try --steps-per-execution 100"


def test_utilization_and_memory_from_sampler_summaries(tmp_path, capsys):
    summaries = {
        "host": {
            "metrics": {
                "cpu_pct": {"mean": 40.0, "p50": 35.0, "p95": 90.0, "max": 99.0},
                "proc_rss_bytes": {"mean": 5e8, "p50": 5e8, "p95": 9e8, "max": 1e9},
            }
        },
        "gpu0": {
            "metrics": {
                "gpu_util_pct": {"mean": 30.0, "p50": 25.0, "p95": 70.0, "max": 80.0},
                "tf_mem_peak_bytes": {"mean": 1e9, "p50": 1e9, "p95": 2e9, "max": 2e9},
            }
        },
    }
    path = make_run(tmp_path, "g", kind="gpu", device="Fake GPU", summaries=summaries)
    row = compare.run_row(compare.read_run(path))
    assert (row["cpu_util_mean_pct"], row["cpu_util_p95_pct"]) == (40.0, 90.0)
    assert (row["device_util_mean_pct"], row["device_util_p95_pct"]) == (30.0, 70.0)
    assert row["host_mem_peak_bytes"] == 1e9 and row["device_mem_peak_bytes"] == 2e9
    code, out, _ = run_cli([path], capsys)
    assert code == 0 and "40/90" in out and "30/70" in out


def test_utilization_read_from_csvs_when_run_json_has_no_summaries(tmp_path):
    path = make_run(tmp_path, "u")
    (path / "utilization").mkdir()
    pd.DataFrame(
        {"time_s": [0.0, 1.0, 2.0, 3.0], "cpu_pct": [50.0, 50.0, 50.0, 50.0], "proc_rss_bytes": [1e8, 3e8, 2e8, 2e8]}
    ).to_csv(path / "utilization" / "host.csv", index=False)
    row = compare.run_row(compare.read_run(path))
    assert row["cpu_util_mean_pct"] == 50.0 and row["host_mem_peak_bytes"] == 3e8


def test_mfu_is_achieved_over_measured_peak_of_the_runs_precision(tmp_path):
    peak = {"matmul_flops_per_second": {"float32": 8e9, "bfloat16": 3.2e10}}
    # 1000 images trained in 0.45 s (of a 0.5 s epoch) = 2222 images/s; x 1e6 FLOPs/image = 2.22e9 FLOP/s
    f32 = compare.run_row(
        compare.read_run(make_run(tmp_path, "f32", epoch_seconds=(1.0, 0.5), flops_per_image=1e6, peak=peak))
    )
    assert f32["achieved_flops_per_second"] == pytest.approx(1e9 / 0.45)
    assert f32["peak_dtype"] == "float32" and f32["mfu_pct"] == pytest.approx(100 / 0.45 / 8)
    bf16 = compare.run_row(
        compare.read_run(
            make_run(
                tmp_path, "bf16", epoch_seconds=(1.0, 0.5), flops_per_image=1e6, peak=peak, precision="mixed_bfloat16"
            )
        )
    )
    assert bf16["peak_dtype"] == "bfloat16" and bf16["mfu_pct"] == pytest.approx(100 / 0.45 / 32)
    none = compare.run_row(compare.read_run(make_run(tmp_path, "nopeak", flops_per_image=1e6)))
    assert math.isnan(none["mfu_pct"])
    assert "the epoch runs at 28 % of the device's float32 ceiling" in compare.advice(f32, "compute")
    # A peak of format 4 names its best rate (a convolution may beat the matmul): that is the one used.
    newer = {"peak_flops_per_second": {"float32": 1e10}, **peak}
    row = compare.run_row(
        compare.read_run(make_run(tmp_path, "f32new", epoch_seconds=(1.0, 0.5), flops_per_image=1e6, peak=newer))
    )
    assert row["peak_flops_per_second"] == 1e10 and row["mfu_pct"] == pytest.approx(100 / 0.45 / 10)


def test_different_batch_sizes_and_image_counts_are_flagged(tmp_path, capsys):
    a = make_run(tmp_path, "a")
    b = make_run(tmp_path, "b", batch_size=128, images=128, epoch_seconds=(2.0, 0.7, 0.7))
    code, out, err = run_cli([a, b, "--format", "json"], capsys)
    assert code == 0
    rows = {r["run"]: r for r in json.loads(out)["rows"]}
    assert rows["a"]["flags"] == [] and len(rows["b"]["flags"]) == 2
    assert "batch size 128 vs 100" in rows["b"]["flags"][0]
    assert "images per epoch 1280 vs 1000" in rows["b"]["flags"][1]
    assert "warning: b: batch size 128 vs 100" in err
    # with different image counts the speed-up is the images/s ratio, not the seconds ratio
    # (b takes longer per epoch but trains more images: a, at 1667 images/s, is the slowest)
    assert json.loads(out)["baseline"] == "a"
    assert rows["b"]["speedup"] == pytest.approx((1280 / 0.7) / (1000 / 0.6))
    code, out, _ = run_cli([a, b], capsys)
    assert "warning: b: images per epoch 1280 vs 1000" in out


def test_text_markdown_csv_outputs_and_chart(runs, tmp_path, capsys):
    code, out, _ = run_cli([*runs], capsys)
    assert code == 0
    assert "slow_input *" in out and "why:" in out and "input explains" in out
    out_file = tmp_path / "out" / "compare.md"
    code, _, err = run_cli([*runs, "--format", "markdown", "--out", out_file], capsys)
    assert code == 0 and f"wrote {out_file}" in err
    assert out_file.read_text().startswith("# devprof compare")
    chart = out_file.with_suffix(".png")
    assert chart.read_bytes()[:4] == b"\x89PNG" and "![seconds per epoch](compare.png)" in out_file.read_text()
    code, out, _ = run_cli([*runs, "--format", "csv"], capsys)
    frame = pd.read_csv(io.StringIO(out))
    assert list(frame["run"]) == ["fast", "slow_input", "slow_host"]
    assert frame.loc[1, "seconds_per_epoch"] == pytest.approx(1.0)


# ---------------------------------------------------------------- the seed's table


def test_seed_table_renders_with_its_speedups(capsys):
    code, out, _ = run_cli(["--external", SEED_TABLE, "--format", "json"], capsys)
    assert code == 0
    result = json.loads(out)
    rows = {r["device"]: r for r in result["rows"]}
    assert result["baseline"] == "Colab TPU"  # the slowest, 382 s
    assert len(rows) == 7 and all(r["external"] for r in rows.values())
    assert rows["GTX 1080 Ti"]["speedup"] == pytest.approx(382 / 4)
    assert rows["i5-8250U"]["epoch_images_per_second"] == pytest.approx(50000 / 320)
    assert rows["i5-8250U"]["images_per_second"] is None  # its training time alone was not measured
    code, out, _ = run_cli(["--external", SEED_TABLE, "--baseline", "i5-8250U", "--format", "json"], capsys)
    rows = {r["device"]: r for r in json.loads(out)["rows"]}
    assert rows["GTX 1080 Ti"]["speedup"] == pytest.approx(80.0)  # 320 / 4
    assert rows["i7-9700K"]["speedup"] == pytest.approx(320 / 36)
    assert rows["Colab TPU"]["speedup"] == pytest.approx(320 / 382)
    assert "80.0x slower than GTX 1080 Ti" in rows["i5-8250U"]["why"]
    code, out, _ = run_cli(["--external", SEED_TABLE, "--baseline", "i5-8250U"], capsys)
    assert "80.0x" in out and "i5-8250U" in out


def test_external_rows_sit_beside_real_runs_and_are_flagged(runs, capsys):
    code, out, err = run_cli([runs[0], "--external", SEED_TABLE, "--format", "json"], capsys)
    assert code == 0
    result = json.loads(out)
    fast = next(r for r in result["rows"] if r["run"] == "fast")
    assert fast["external"] is False
    assert any("images per epoch 1000 vs 50000" in flag for flag in fast["flags"])
    assert "warning: fast:" in err


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("case", ["not_a_run", "missing", "no_epochs", "bad_csv", "csv_columns", "baseline", "none"])
def test_bad_input_is_one_error_line_and_exit_2(case, tmp_path, capsys):
    run = make_run(tmp_path, "ok")
    argv = {
        "not_a_run": [tmp_path / "plain"],
        "missing": [tmp_path / "nope"],
        "no_epochs": [tmp_path / "empty"],
        "bad_csv": [run, "--external", tmp_path / "bad.csv"],
        "csv_columns": ["--external", tmp_path / "cols.csv"],
        "baseline": [run, "--baseline", "no-such"],
        "none": [],
    }[case]
    (tmp_path / "plain").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "run.json").write_text(json.dumps({"status": "running", "epochs": []}))
    (tmp_path / "bad.csv").write_text("device,seconds_per_epoch\nX,fast\n")
    (tmp_path / "cols.csv").write_text("name,time\nX,3\n")
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and out == ""


# ---------------------------------------------------------------- one real pair of runs


def _real_pair(out, capsys) -> dict:

    base = [
        "run",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--limit-images",
        "600",
        "--limit-test-images",
        "500",
        "--batch-size",
        "50",
        "--epochs",
        "2",
        "--no-profile",
        "--no-sample",
        "--quiet",
        "--out",
        str(out),
    ]
    assert cli.main([*base, "--run-name", "plain"]) == 0
    assert cli.main([*base, "--run-name", "delayed", "--inject-input-delay-ms", "100"]) == 0
    capsys.readouterr()
    code, stdout, err = run_cli([out / "plain", out / "delayed", "--format", "json"], capsys)
    assert code == 0, err
    return json.loads(stdout)


@pytest.mark.slow
def test_real_runs_name_injected_input_delay_as_the_reason(tmp_path, capsys):
    """Ground truth: 100 ms more input wait per batch of 50 is +2 ms/image, and compare must name input.

    Batches of 50 (not the seed's 100) make the injected cost several times the step's
    compute per image, so it stands out of run-to-run noise even when another job slows
    one run's compute. Should the pair still not be comparable, it is run once more (the
    ground-truth check on the input gap holds either way).
    """
    for attempt in range(2):
        result = _real_pair(tmp_path / f"try{attempt}", capsys)
        rows = {r["run"]: r for r in result["rows"]}
        plain, delayed = rows["plain"], rows["delayed"]
        gaps = {p: delayed[f"{p}_ms_per_image"] - plain[f"{p}_ms_per_image"] for p in compare.COMPONENTS}
        assert 1.8 < gaps["input"] < 3.0, gaps  # 100 ms / 50 images = 2 ms/image; a late wake-up only adds
        noise = sum(abs(gap) for part, gap in gaps.items() if part != "input")
        if noise < gaps["input"]:
            break
    assert plain["flags"] == [] and delayed["flags"] == []
    assert result["fastest"] == "plain" and result["baseline"] == "delayed", (gaps, "machine too busy to compare?")
    assert " input explains " in delayed["why"], (delayed["why"], gaps)
    assert "prefetch" in delayed["why"]
    assert plain["train_flops_per_image"] > 0 and plain["achieved_flops_per_second"] > 0


def test_baseline_by_device_among_runs_and_external_rows(runs, capsys):
    # External rows have no path; naming a baseline must still look past them.
    code, out, err = run_cli([*runs, "--external", SEED_TABLE, "--baseline", "i5-8250U", "--format", "json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    rows = {r["device"]: r for r in result["rows"] if r["external"]}
    assert rows["i5-8250U"]["speedup"] == pytest.approx(1.0)
    assert rows["GTX 1080 Ti"]["speedup"] == pytest.approx(80.0)
    code, out, err = run_cli([*runs, "--external", SEED_TABLE, "--baseline", "fast", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["baseline"] == "fast"


def test_mfu_takes_the_traced_ops_flops_where_they_cover_the_step(tmp_path):
    import dataclasses
    from types import SimpleNamespace
    from typing import cast

    from analysis.comparison.rows import _flops_per_image
    from analysis.worker import Analysis

    read = compare.read_run(make_run(tmp_path, "ops", epoch_seconds=(1.0, 0.5), flops_per_image=1e6))
    batch = read.record.config["batch_size"]
    assert _flops_per_image(read, batch) == (1e6, "model")  # no trace: the layers' count
    # the ops' costs say 2.5e6 FLOPs per image (the layers' count says 1e6): the ops are what ran
    # stand-ins for an Analysis: _flops_per_image reads only its roofline
    covered = cast(Analysis, SimpleNamespace(roofline={"flops_per_step": 2.5e6 * batch, "known_time_pct": 97.0}))
    assert _flops_per_image(dataclasses.replace(read, analysis=covered), batch) == (pytest.approx(2.5e6), "ops")
    # ops with costs for only part of the step would undercount: the model's count stands
    partial = cast(Analysis, SimpleNamespace(roofline={"flops_per_step": 2.5e6 * batch, "known_time_pct": 60.0}))
    assert _flops_per_image(dataclasses.replace(read, analysis=partial), batch) == (1e6, "model")


def test_compare_advises_precision_only_from_measured_ceilings(tmp_path):
    # An AVX512-BF16 CPU without AMX: devprof peak measures bfloat16 at about half of float32.
    peak = {"peak_flops_per_second": {"float32": 3.25e11, "bfloat16": 1.85e11}}
    f32 = compare.run_row(compare.read_run(make_run(tmp_path, "f32", peak=peak)))
    bf16 = compare.run_row(compare.read_run(make_run(tmp_path, "bf16", peak=peak, precision="mixed_bfloat16")))
    assert f32["matrix_flops_per_second"] == {"float32": 3.25e11, "bfloat16": 1.85e11}
    assert "bfloat16" not in compare.advice(f32, "compute")
    assert (
        "go back to float32 (`--precision float32`): float32 325 GFLOP/s against bfloat16 185 GFLOP/s"
        in compare.advice(bf16, "compute")
    )
    faster = compare.run_row(
        compare.read_run(
            make_run(tmp_path, "amx", peak={"peak_flops_per_second": {"float32": 3e11, "bfloat16": 1.2e12}})
        )
    )
    assert "--precision mixed_bfloat16" in compare.advice(faster, "compute")
    unmeasured = compare.run_row(compare.read_run(make_run(tmp_path, "none")))
    assert "mixed_bfloat16" not in compare.advice(unmeasured, "compute")


# ---------------------------------------------------------------- one run path, given as a string


def test_compare_takes_one_run_path_as_one_run_not_as_its_letters(tmp_path):
    run = small_run(tmp_path / "run")
    for given in (str(run), run):
        assert list(analysis.compare(given).table["run"]) == ["run"]


def _tune_folder(
    folder: Path, device: str, default_s: float, best_s: float, kept: list[dict], start: dict | None = None
) -> Path:
    """A `devprof tune` folder as the command leaves it: tune.json and its trials' run folders. `start`:
    the options it started from (a tune's own; {}: one from before tunes started at TensorFlow's)."""
    trial = folder / "01-baseline-profile"
    trial.mkdir(parents=True)
    (trial / "run.json").write_text(json.dumps({"status": "complete", "device": {"name": device, "kind": "cpu"}}))
    options = {"--tensorflow-defaults": None} if start is None else start
    summary = {"setting": {"fixes": [], "options": options, "env": {}}, "step_ms": 100.0, "images_per_second": 320.0}
    document = {
        "schema": "devprof.tune/1",
        "status": "finished",
        "baseline": {**summary, "seconds_per_epoch": default_s, "loss": 2.0},
        "best": {**summary, "seconds_per_epoch": best_s, "loss": 2.0, "command": "devprof run --jit-compile"},
        "trials": kept + [{"rule": "no_prefetch", "label": "prefetch", "kept": False, "measured_ms": 0.1}],
    }
    (folder / "tune.json").write_text(json.dumps(document))
    return folder


def test_tunes_are_compared_at_their_default_and_best_setting_with_what_made_the_difference(tmp_path, capsys):
    from profiler.cli import main as cli_main

    xla = {"rule": "below_roofline", "label": "XLA compilation", "kept": True, "measured_ms": 39.6}
    laptop = _tune_folder(tmp_path / "laptop", "i5-8250U", 156.0, 93.9, [xla])
    desktop = _tune_folder(tmp_path / "desktop", "i7-9700K", 36.0, 36.0, [], start={})
    table = compare.compare_runs([laptop, desktop])
    assert list(table["run"]) == ["laptop (default)", "laptop (best)", "desktop (default)", "desktop (best)"]
    assert list(table["device"]) == ["i5-8250U", "i5-8250U", "i7-9700K", "i7-9700K"]
    assert list(table["seconds_per_epoch"]) == [156.0, 93.9, 36.0, 36.0]
    notes = list(table["notes"])
    assert notes[1] == (
        "tune laptop, best against default: XLA compilation (below_roofline): 39.6 ms a step saved; "
        "devprof run --jit-compile"
    )
    assert "nothing measured faster than the default" in notes[3]
    assert notes[0] == "TensorFlow's own setting, as the program runs outside devprof" and notes[2] == ""
    assert cli_main(["compare", str(laptop), str(desktop)]) == 0
    out = capsys.readouterr().out
    assert "laptop (best)" in out and "i7-9700K" in out and "(external)" not in out


def test_a_tune_folder_without_an_answer_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "tune.json").write_text(json.dumps({"schema": "devprof.tune/1", "status": "running", "baseline": None}))
    with pytest.raises(compare.CompareError, match="the tune has no baseline and best yet"):
        compare.compare_runs([folder])


@pytest.mark.parametrize("text, said", [("{", "not JSON"), ('{"schema": "other/1"}', "not a tune's answer")])
def test_a_tune_json_that_is_no_tunes_answer_is_refused_in_one_line(tmp_path, text, said):
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "tune.json").write_text(text)
    with pytest.raises(compare.CompareError, match=said):
        compare.compare_runs([folder])
