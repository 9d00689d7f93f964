"""`devprof tune` (`profiler.cli.tune`): fixes tried in alternated trials, kept where faster beyond the
noise, tried again from the kept setting, the budget kept, training changes checked by their loss, and
tune.json written whatever happens. The trials here are runs a fake `devprof run` writes, with step
times the test chooses; the real command is run once on the CNN in the slow tier."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from profiler.cli import main as cli_main
from profiler.cli import tune


def _fix(rule: str, saving_ms: float) -> dict:
    return {"rule": rule, "advice": f"advice for {rule}", "saving_ms": saving_ms}


class FakeRuns:
    """A `devprof run` that writes a trial's steps.csv and run.json: step time from `step_ms(argv)`,
    with 1 % noise, and loss from `loss(argv)`; `calls` records every argv and environment."""

    def __init__(self, step_ms, loss=lambda argv, env: 2.0, fail_at: int | None = None, seed: int = 0):
        self.step_ms, self.loss, self.fail_at = step_ms, loss, fail_at
        self.calls: list[tuple[list[str], dict]] = []
        self.random = random.Random(seed)

    def __call__(self, argv: list[str], env: dict[str, str]) -> int:
        self.calls.append((argv, env))
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise KeyboardInterrupt
        out = Path(argv[argv.index("--out") + 1]) / argv[argv.index("--run-name") + 1]
        out.mkdir(parents=True)
        ms = self.step_ms(argv, env)
        rows = [
            {
                "epoch": 1,
                "step": i,
                "steps": 1,
                "start_time_s": i,
                "input_ms": 0.0,
                "call_ms": ms,
                "other_host_ms": 0.0,
                "step_ms": ms * (1 + 0.01 * self.random.gauss(0, 1)),
                "images": int(argv[len(argv) - 1 - argv[::-1].index("--batch-size") + 1])
                if "--batch-size" in argv
                else 32,
            }
            for i in range(20)
        ]
        pd.DataFrame(rows).to_csv(out / "steps.csv", index=False)
        (out / "run.json").write_text(json.dumps({"status": "complete", "epochs": [{"loss": self.loss(argv, env)}]}))
        return 0


def _tuner(tmp_path, runs, fixes_by_setting, budget_s=3600.0, clock=None, max_batch=float("nan"), facts=None):
    """A tuner whose analysis gives the fixes `fixes_by_setting(argv of the profiled run)` returns, and the
    memory headroom `max_batch`."""
    profiled: dict[str, list[str]] = {}

    def runner(argv, env):
        code = runs(argv, env)
        profiled[argv[argv.index("--run-name") + 1]] = argv
        return code

    def analyze(run_dir):
        return SimpleNamespace(
            verdict={"fixes": fixes_by_setting(profiled[run_dir.name])},
            mean={"host_pct": 40.0, "compute_pct": 60.0},
            memory=SimpleNamespace(allocators=[SimpleNamespace(max_batch=max_batch)]),
            facts=facts,
        )

    return tune.Tuner(
        tmp_path / "tune",
        ["--batch-size", "32"],
        budget_s,
        batch_size=32,
        epoch_images=50_000,
        pipeline="cnn",
        runner=runner,
        analyze=analyze,
        clock=clock or (lambda: 0.0),
        say=lambda line: None,
    )


def test_a_fix_faster_beyond_the_noise_is_kept_and_the_next_is_tried_from_it(tmp_path):
    def step_ms(argv, env):
        return (
            100.0 - (40.0 if "--parallel-calls" in argv else 0.0) - (10.0 if "--steps-per-execution" in argv else 0.0)
        )

    def fixes(argv):  # the input wait until the pipeline is fixed, then host overhead
        return [_fix("host_bound", 3.0)] if "--parallel-calls" in argv else [_fix("input_wait", 38.0)]

    tuner = _tuner(tmp_path, FakeRuns(step_ms), fixes)
    document = tuner.run()
    assert document["status"] == "finished"
    first, second = document["trials"]
    assert (first["rule"], first["result"], first["kept"]) == ("input_wait", "faster", True)
    assert first["measured_ms"] == pytest.approx(40.0, abs=3) and first["estimate_holds"] is True
    assert "the estimate" not in first["why"]
    assert (
        second["estimate_holds"] is False and "the estimate (3 ms) is off by more than max(35 %, 3 ms)" in second["why"]
    )
    assert (second["rule"], second["kept"]) == ("host_bound", True)
    assert second["setting"]["options"] == {
        "--tensorflow-defaults": None,
        "--parallel-calls": "auto",
        "--prefetch": "auto",
        "--steps-per-execution": "16",
    }
    assert document["best"]["step_ms"] == pytest.approx(50.0, abs=2)
    assert document["baseline"]["step_ms"] == pytest.approx(100.0, abs=2)
    assert document["best"]["seconds_per_epoch"] == pytest.approx(50_000 / (32 / 0.05), rel=0.05)
    assert "--parallel-calls auto --prefetch auto --steps-per-execution 16" in document["best"]["command"]


def test_the_default_and_the_best_are_timed_side_by_side_at_the_end_so_a_drifting_machine_does_not_skew_them(
    tmp_path,
):
    calls = [0]

    def drifting(argv, env):  # XLA halves the step; every trial runs 3 % slower than the one before
        calls[0] += 1
        return (50.0 if "--jit-compile" in argv else 100.0) * (1 + 0.03 * calls[0])

    runs = FakeRuns(drifting)
    document = _tuner(tmp_path, runs, lambda argv: [_fix("below_roofline", 50.0)]).run()
    (xla,) = document["trials"]
    assert xla["kept"]
    side = document["best_against_default"]
    assert side["result"] == "faster" and len(side["trials"]) >= 2 * tune.PAIRS
    assert all(name.endswith(("-baseline", "-best")) for name in side["trials"])
    # from the same minutes: twice as fast, as XLA makes it here (the first baseline's trials against the last
    # ones of the best would say about 1.6x)
    assert document["baseline"]["step_ms"] / document["best"]["step_ms"] == pytest.approx(2.0, rel=0.05)
    assert "the best against the default, side by side: faster" in tune.render_text(document)


def test_a_fix_that_changes_nothing_is_not_sure_and_not_kept(tmp_path):
    runs = FakeRuns(lambda argv, env: 100.0)
    document = _tuner(tmp_path, runs, lambda argv: [_fix("below_roofline", 20.0)]).run()
    (trial,) = document["trials"]
    assert trial["result"] == "not sure" and not trial["kept"] and trial["estimate_holds"] is False
    assert document["best"]["setting"]["options"] == {"--tensorflow-defaults": None}
    assert len(runs.calls) == 1 + 2 * tune.MAX_PAIRS  # not sure after 3 pairs: more trials, then it stops


def test_a_faster_precision_whose_loss_is_nan_is_rejected_and_said_to_be(tmp_path):
    runs = FakeRuns(
        lambda argv, env: 60.0 if "--precision" in argv else 100.0,
        loss=lambda argv, env: float("nan") if "--precision" in argv else 2.0,
    )
    document = _tuner(tmp_path, runs, lambda argv: [_fix("fp32_on_matrix_units", 40.0)]).run()
    (trial,) = document["trials"]
    assert trial["result"] == "faster" and not trial["kept"] and "rejected: its loss" in trial["why"]
    assert trial["baseline_loss"] == 2.0 and trial["loss"] is None


def test_no_trial_starts_once_the_budget_is_spent(tmp_path):
    now = [0.0]
    runs = FakeRuns(lambda argv, env: 100.0)

    def counting(argv, env):
        now[0] += 60.0  # each trial a minute
        return runs(argv, env)

    tuner = _tuner(
        tmp_path, counting, lambda argv: [_fix("below_roofline", 20.0)], budget_s=150.0, clock=lambda: now[0]
    )
    document = tuner.run()
    assert document["status"] == "budget_spent"
    assert len(runs.calls) == 3  # started at 0, 60 and 120 s; none at 180
    assert "budget was spent" in document["trials"][0]["why"]


def test_the_command_refuses_bad_options_before_any_trial(tmp_path, capsys):
    assert cli_main(["tune", "--batch-size", "0", "--out", str(tmp_path)]) == 2
    assert "--batch-size must be at least 1" in capsys.readouterr().err
    assert cli_main(["tune", "--budget", "0", "--out", str(tmp_path)]) == 2
    assert list(tmp_path.iterdir()) == []


def test_the_best_command_is_the_users_own_options_and_the_kept_fixes(tmp_path, monkeypatch, capsys):
    runs = FakeRuns(lambda argv, env: 60.0 if "--jit-compile" in argv else 100.0)
    monkeypatch.setattr(tune, "run_in_process", runs)
    monkeypatch.setattr(
        tune, "_analyze", lambda run_dir: SimpleNamespace(verdict={"fixes": [_fix("below_roofline", 30.0)]}, mean={})
    )
    assert cli_main(["tune", "--out", str(tmp_path), "--run-name", "t", "--batch-size", "64", "--seed", "3"]) == 0
    document = json.loads((tmp_path / "t" / "tune.json").read_text())
    # TensorFlow's own setting is where tune starts, and the command reproduces what was measured
    assert document["best"]["command"] == "devprof run --batch-size 64 --seed 3 --tensorflow-defaults --jit-compile"
    first = runs.calls[0][0]
    assert (
        first[:5] == ["--batch-size", "64", "--seed", "3", "--tensorflow-defaults"]
        and "--epochs" in first
        and "--no-profile" not in first
    )
    assert "--no-profile" in runs.calls[1][0]  # the trials are not profiled; the baseline analysed is
    assert "--measure-peak" in first and "--measure-peak" not in runs.calls[1][0]  # with the ceilings
    out = capsys.readouterr().out
    assert (
        "| below_roofline | --jit-compile |" in out
        and "best: devprof run --batch-size 64 --seed 3 --tensorflow-defaults --jit-compile" in out
    )


def test_ctrl_c_keeps_every_finished_trial_in_tune_json(tmp_path, monkeypatch, capsys):
    runs = FakeRuns(lambda argv, env: 60.0 if "--jit-compile" in argv else 100.0, fail_at=5)
    monkeypatch.setattr(tune, "run_in_process", runs)
    monkeypatch.setattr(
        tune, "_analyze", lambda run_dir: SimpleNamespace(verdict={"fixes": [_fix("below_roofline", 30.0)]}, mean={})
    )
    code = cli_main(["tune", "--out", str(tmp_path), "--run-name", "t"])
    assert code == 130
    document = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert document["status"] == "interrupted"
    assert sorted(p.name for p in (tmp_path / "t").iterdir() if p.is_dir()) == [
        "01-baseline-profile",
        "02-baseline",
        "03-below_roofline",
        "04-baseline",
    ]
    assert "tune: interrupted" in capsys.readouterr().out


def _batch(argv) -> int:
    return int(argv[len(argv) - 1 - argv[::-1].index("--batch-size") + 1])


def test_a_larger_batch_within_the_measured_headroom_is_compared_per_image_and_its_loss_checked(tmp_path):
    # XLA changes nothing; twice the batch takes 1.5x the step: 25 % less time per image.
    runs = FakeRuns(lambda argv, env: 100.0 * (1.5 if _batch(argv) == 64 else 1.0))
    document = _tuner(tmp_path, runs, lambda argv: [_fix("below_roofline", 20.0)], max_batch=100.0).run()
    xla, batch = document["trials"]
    assert (xla["label"], xla["result"]) == ("XLA compilation", "not sure")
    assert (batch["label"], batch["result"], batch["kept"]) == ("batch 64", "faster", True)
    assert batch["step_ms"] == pytest.approx(150.0, rel=0.03)  # per step, at its own batch
    assert batch["measured_ms"] == pytest.approx(25.0, abs=3)  # per step of the baseline's 32 images
    assert batch["loss"] == 2.0 and batch["baseline_loss"] == 2.0
    # both sides of the batch's comparison train on the same images: 64 steps of the larger batch
    compared = [argv for argv, _ in runs.calls if argv[argv.index("--run-name") + 1] in batch["trials"]]
    assert len(compared) == len(batch["trials"]) >= 2 * tune.PAIRS
    assert {argv[argv.index("--limit-images") + 1] for argv in compared} == {str(64 * tune.TRIAL_STEPS)}
    # the user's 32 replaced, not repeated
    assert document["best"]["command"] == "devprof run --tensorflow-defaults --batch-size 64"
    assert "dataset.batch(64)" in document["best"]["code"]


def test_no_larger_batch_is_tried_where_the_headroom_is_unknown_or_too_small(tmp_path):
    for max_batch in (float("nan"), 32.0):
        runs = FakeRuns(lambda argv, env: 100.0)
        document = _tuner(
            tmp_path / str(max_batch), runs, lambda argv: [_fix("below_roofline", 20.0)], max_batch=max_batch
        ).run()
        assert [trial["label"] for trial in document["trials"]] == ["XLA compilation"]


def test_a_larger_batch_whose_loss_is_more_than_a_tenth_above_is_rejected(tmp_path):
    runs = FakeRuns(
        lambda argv, env: 100.0 * (1.2 if _batch(argv) == 64 else 1.0),
        loss=lambda argv, env: 2.5 if _batch(argv) == 64 else 2.0,
    )
    document = _tuner(tmp_path, runs, lambda argv: [_fix("compute_bound", 20.0)], max_batch=64.0).run()
    batch = document["trials"][-1]
    assert batch["result"] == "faster" and not batch["kept"] and "rejected: its loss" in batch["why"]


def test_one_nan_loss_among_finite_trials_rejects_the_fix(tmp_path):
    count = [0]

    def loss(argv, env):
        if "--precision" not in argv:
            return 2.0
        count[0] += 1
        return float("nan") if count[0] == 2 else 2.0

    runs = FakeRuns(lambda argv, env: 60.0 if "--precision" in argv else 100.0, loss=loss)
    (trial,) = _tuner(tmp_path, runs, lambda argv: [_fix("fp32_on_matrix_units", 40.0)]).run()["trials"]
    assert trial["result"] == "faster" and not trial["kept"] and trial["loss"] is None


def test_workers_of_one_job_on_one_machine_get_their_share_of_its_cores_as_threads(tmp_path):
    runs = FakeRuns(lambda argv, env: 70.0 if env.get("TF_NUM_INTRAOP_THREADS") == "2" else 100.0)
    facts = SimpleNamespace(cpu_cores=4.0, other_cpu_pct=50.0, job_workers_here=1)
    document = _tuner(tmp_path, runs, lambda argv: [_fix("cpu_contention", 25.0)], facts=facts).run()
    (trial,) = document["trials"]
    assert trial["setting"]["env"] == {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "1"}
    assert trial["kept"] and document["best"]["command"].startswith(
        "TF_NUM_INTRAOP_THREADS=2 TF_NUM_INTEROP_THREADS=1 "
    )
    # other programs' CPU, or no figures: the fix is to stop them, advice, and no trial is spent on it
    for index, others in enumerate((SimpleNamespace(cpu_cores=4.0, other_cpu_pct=50.0, job_workers_here=0), None)):
        runs = FakeRuns(lambda argv, env: 100.0)
        document = _tuner(tmp_path / str(index), runs, lambda argv: [_fix("cpu_contention", 25.0)], facts=others).run()
        assert document["trials"] == [] and document["advice"][0]["rule"] == "cpu_contention"


def test_the_best_setting_as_the_code_of_ones_own_keras_program():
    setting = tune.Setting(
        {
            "--precision": "mixed_bfloat16",
            "--steps-per-execution": "8",
            "--jit-compile": None,
            "--parallel-calls": "auto",
            "--prefetch": "auto",
        },
        {"TF_ENABLE_ONEDNN_OPTS": "1"},
    )
    code = tune.code_for(setting, "dataset").splitlines()
    assert code[0] == 'os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"  # before TensorFlow is imported'
    assert code[1].startswith('tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")')
    assert "options.experimental_optimization.map_parallelization = True" in code
    assert "dataset = dataset.prefetch(tf.data.AUTOTUNE)" in code
    assert code[-1] == "model.compile(optimizer, loss, steps_per_execution=8, jit_compile=True)"
    assert tune.code_for(tune.Setting(), "cnn") == ""


@pytest.mark.slow  # a real browser
def test_the_tune_report_opens_in_chromium_with_the_default_the_best_and_every_fix(tmp_path):
    import browser

    runs = FakeRuns(lambda argv, env: 60.0 if "--jit-compile" in argv else 100.0)
    tuner = _tuner(tmp_path, runs, lambda argv: [_fix("below_roofline", 30.0), _fix("memory_growth", 1.0)])
    tuner.document = tuner.run()
    tuner.write()
    rows = "[...document.querySelectorAll('tr')].map(r => r.innerText.replace(/\\s+/g, ' ').trim())"
    loaded = browser.load(tmp_path / "tune" / "report.html", evaluate=(rows, "document.querySelector('pre').innerText"))
    assert loaded.errors == [] and loaded.requests == [], (loaded.errors, loaded.requests)
    shown = loaded.values[rows]
    best = tuner.document["best"]
    assert shown[1].startswith("default ") and shown[2] == (
        f"best {best['seconds_per_epoch']:.2f} {best['step_ms']:.2f} {best['images_per_second']:.2f}"
    )
    assert any(row.startswith("below_roofline XLA compilation") and " faster yes " in row for row in shown)
    assert (
        loaded.values["document.querySelector('pre').innerText"] == "model.compile(optimizer, loss, jit_compile=True)"
    )


class WorkRuns:
    """A `devprof run` whose steps do real work in this process, timed as the loop times them: Python
    arithmetic, `work(argv, env)` thousand additions a step (one thread, as a hog competes with it).
    Under load its step times are as noisy as a real trial's."""

    def __init__(self, work):
        self.work = work

    def __call__(self, argv, env):
        out = Path(argv[argv.index("--out") + 1]) / argv[argv.index("--run-name") + 1]
        out.mkdir(parents=True)
        rows = []
        for step in range(12):
            start = time.perf_counter()
            sum(range(self.work(argv, env) * 1000))
            ms = (time.perf_counter() - start) * 1000.0
            rows.append(
                {"epoch": 1, "step": step, "steps": 1, "start_time_s": step, "input_ms": 0.0, "call_ms": ms,
                 "other_host_ms": 0.0, "step_ms": ms, "images": 32}
            )  # fmt: skip
        pd.DataFrame(rows).to_csv(out / "steps.csv", index=False)
        (out / "run.json").write_text(json.dumps({"status": "complete", "epochs": [{"loss": 2.0}]}))
        return 0


@pytest.mark.slow
@pytest.mark.hogs
def test_under_two_cpu_hogs_a_fix_that_changes_nothing_is_never_called_faster(tmp_path):
    import subprocess
    import sys

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        results = []
        for attempt in range(5):
            runs = WorkRuns(lambda argv, env: 200)  # the fix changes nothing: the same work on both sides
            document = _tuner(tmp_path / f"noop-{attempt}", runs, lambda argv: [_fix("below_roofline", 5.0)]).run()
            results.append(document["trials"][0]["result"])
        # the control, in the same conditions: a fix that halves the work is seen (not sure is allowed)
        halved = WorkRuns(lambda argv, env: 100 if "--jit-compile" in argv else 200)
        control = _tuner(tmp_path / "halved", halved, lambda argv: [_fix("below_roofline", 5.0)]).run()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert "faster" not in results, results
    assert control["trials"][0]["result"] in ("faster", "not sure"), control["trials"][0]
    assert control["trials"][0]["result"] == "faster" or results.count("not sure") > 0


TINY_MODEL = """
import keras


def build():
    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])
"""


@pytest.mark.slow  # real `devprof run` trials beside two CPU hogs: a minute or two
@pytest.mark.hogs
def test_under_two_cpu_hogs_real_trials_of_a_setting_that_changes_nothing_are_not_called_faster(tmp_path, monkeypatch):
    """The whole loop on real trials: `devprof run` processes of a small model, the analysis ranking
    oneDNN, whose setting (`TF_ENABLE_ONEDNN_OPTS=1`) this user has already set, so both sides run the
    same kernels and only the noise of a loaded machine tells them apart."""
    import subprocess
    import sys

    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")

    module = tmp_path / "tiny.py"
    module.write_text(TINY_MODEL)

    def analyze(run_dir):
        return SimpleNamespace(verdict={"fixes": [_fix("cpu_without_onednn", 5.0)]}, mean={}, memory=None)

    tuner = tune.Tuner(
        tmp_path / "tune",
        ["--model", f"{module}:build", "--data", "synthetic", "--batch-size", "16"],
        3600.0,
        batch_size=16,
        epoch_images=50_000,
        pipeline=None,
        analyze=analyze,
        say=lambda line: None,
        measure_peak=False,  # the analysis is this test's: no ceilings needed
        max_pairs=tune.PAIRS,  # a setting that changes nothing is not sure: the fewest pairs that can tell
    )
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        document = tuner.run()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert document["status"] == "finished" and len(document["trials"]) == 1, document
    trial = document["trials"][0]
    assert trial["label"] == "oneDNN on" and len(trial["trials"]) == 2 * tune.PAIRS, trial
    # The premise: both sides ran oneDNN's kernels.
    kernels = {
        name: json.loads((tmp_path / "tune" / name / "run.json").read_text())["device"]["onednn_opts"]
        for name in trial["trials"]
    }
    assert set(kernels.values()) == {"1"}, kernels
    assert trial["result"] != "faster", trial
    assert trial["kept"] is False and document["best"]["setting"]["env"] == {}
    assert all(json.loads((tmp_path / "tune" / name / "run.json").read_text())["config"]["tensorflow_defaults"]
               for name in trial["trials"])  # fmt: skip


@pytest.mark.parametrize("host_pct, compute_pct, expected", [(40.0, 60.0, "16"), (56.7, 43.2, "16"), (20.0, 80.0, "8")])
def test_steps_per_call_are_the_advice_at_most_sixteen(host_pct, compute_pct, expected):
    found, _ = tune.candidates(
        {"fixes": [_fix("host_bound", 50.0)]},
        {"host_pct": host_pct, "compute_pct": compute_pct},
        1,
        tune.Setting(),
        set(),
        "cnn",
    )
    assert found[0].options == {"--steps-per-execution": expected}


def _cpu_facts(bfloat16_flops: float):
    """A compute-bound float32 CPU run, 100 ms a step, 80 % of it matrix ops, with measured ceilings."""
    from views import facts_from_mean

    return dataclasses.replace(
        facts_from_mean({}),
        device="cpu",
        precision="float32",
        step_ms=100.0,
        compute_pct=95.0,
        matrix_pct=80.0,
        matrix_ceilings=(("float32", 240e9), ("bfloat16", bfloat16_flops)),
    )


def test_a_compute_bound_float32_run_tries_bfloat16_where_its_measured_ceiling_is_higher_first_if_it_saves_most():
    from analysis.rules import savings

    facts = _cpu_facts(480e9)  # twice float32's: the matrix ops' 80 ms in half the time, 40 ms saved
    found, _ = tune.candidates({"fixes": [_fix("below_roofline", 14.0)]}, {}, 1, tune.start_setting(), set(), "cnn",
                               facts=facts)  # fmt: skip
    assert [each.label for each in found] == ["bfloat16 precision", "XLA compilation"]
    assert found[0].options == {"--precision": "mixed_bfloat16"} and found[0].changes_training
    assert found[0].estimate_ms == pytest.approx(savings.precision_saving(facts).ms(facts)) == pytest.approx(40.0)
    # measured slower (a CPU without bfloat16 units emulates it): not tried
    slower, _ = tune.candidates({"fixes": [_fix("below_roofline", 14.0)]}, {}, 1, tune.start_setting(), set(), "cnn",
                                facts=_cpu_facts(60e9))  # fmt: skip
    assert [each.label for each in slower] == ["XLA compilation"]
    # the same setting under two rules' names is tried once
    both, _ = tune.candidates(
        {"fixes": [_fix("below_roofline", 14.0), _fix("fp32_on_matrix_units", 30.0)]}, {}, 1, tune.start_setting(),
        set(), "cnn", facts=facts,
    )  # fmt: skip
    assert [each.label for each in both].count("bfloat16 precision") == 1


def test_a_saving_the_analysis_gives_per_call_is_estimated_per_step():
    found, _ = tune.candidates({"fixes": [_fix("below_roofline", 320.0)]}, {}, 16, tune.Setting(), set(), "cnn")
    assert found[0].estimate_ms == 20.0


def test_where_nothing_is_kept_the_best_is_the_default_with_the_same_figures(tmp_path, capsys):
    runs = FakeRuns(lambda argv, env: 100.0 * _batch(argv) / 32)  # XLA changes nothing, nor does the batch per image
    document = _tuner(tmp_path, runs, lambda argv: [_fix("below_roofline", 20.0)], max_batch=64.0).run()
    assert [trial["kept"] for trial in document["trials"]] == [False, False]
    assert {key: document["best"][key] for key in document["baseline"]} == document["baseline"]
    text = tune.render_text(document)
    seconds = document["baseline"]["seconds_per_epoch"]
    assert (
        f"seconds per epoch: {seconds:.2f} at the default (TensorFlow's own setting), {seconds:.2f} at the best" in text
    )
