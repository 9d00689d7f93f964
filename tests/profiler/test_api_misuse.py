"""`profiler.profile()` and `profiler.KerasCallback` under misuse: nested steps, a window of only
the compile step, two sessions at once, steps after the block, SIGTERM, os._exit, and fit() stopped
by another callback or Ctrl-C (real TensorFlow, tiny models, synthetic data); and, without
TensorFlow, step counts that are no whole numbers, errors in profile()'s own terms, a session used
before it is entered, an out that is no path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import profiler
from repo_paths import REPO


def read_meta(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())


def quiet_session(out: Path, name: str, **options):
    options = {"profile": False, "sample": False, "quiet": True, **options}
    return profiler.profile(out, run_name=name, **options)


@pytest.mark.slow
def test_nested_steps_are_refused_and_the_run_goes_on(tmp_path):
    with quiet_session(tmp_path, "nested") as session:
        with pytest.raises(RuntimeError, match="session.step\\(\\) is already open; steps do not nest"):
            with session.step(images=4):
                with session.step(images=4):
                    pass
        for _ in range(3):
            with session.step(images=4):
                pass
    meta = read_meta(tmp_path / "nested")
    assert meta["status"] == "complete", meta.get("error")
    steps = pd.read_csv(tmp_path / "nested" / "steps.csv")
    assert steps["step"].tolist() == [0, 1, 2] and (steps["images"] == 4).all()  # the refused step ran no call


@pytest.mark.slow
def test_a_window_of_only_the_compile_step_is_said_at_start(tmp_path, capsys):
    with quiet_session(tmp_path, "compile-only", profile=True, profile_steps="0:1") as session:
        for _ in range(3):
            with session.step():
                pass
    warnings = [w for w in read_meta(tmp_path / "compile-only")["profiler"].get("warnings", []) if "compiles" in w]
    assert len(warnings) == 1 and 'profile_steps="1:11"' in warnings[0], warnings
    assert f"warning: {warnings[0]}" in capsys.readouterr().err


def _fake_batches(session, count):
    for _ in session.iterate(range(count)):
        with session.step(images=8):
            pass


@pytest.mark.slow
def test_a_second_session_at_once_is_refused_and_the_first_keeps_only_its_own_steps(tmp_path):
    import threading

    import analysis

    refused = []
    with quiet_session(tmp_path, "outer", profile=True, profile_steps="2:6") as outer:
        for step in range(8):
            with outer.step(images=8):
                time.sleep(0.005)  # a step of some length: no-op steps are not what this is about
                if step == 3:  # a second session inside the first one's loop
                    with pytest.raises(RuntimeError, match="another profile\\(\\) session is recording into"):
                        with quiet_session(tmp_path, "inner", profile=True, profile_steps="0:4") as inner:
                            _fake_batches(inner, 4)

                    def other_thread():  # and one from another thread
                        try:
                            with quiet_session(tmp_path, "thread"):
                                pass
                        except RuntimeError as exc:
                            refused.append(str(exc))

                    thread = threading.Thread(target=other_thread)
                    thread.start()
                    thread.join()
    assert len(refused) == 1 and "one session records at a time" in refused[0], refused
    assert not (tmp_path / "inner").exists() and not (tmp_path / "thread").exists()  # refused before writing
    assert read_meta(tmp_path / "outer")["status"] == "complete"
    result = analysis.analyze(tmp_path / "outer")
    assert result.step_source == "markers"
    assert result.steps["step"].tolist() == [2, 3, 4, 5], result.steps  # its own window, each step once
    with quiet_session(tmp_path, "after") as after:  # once the first has ended, another may start
        _fake_batches(after, 2)
    assert read_meta(tmp_path / "after")["status"] == "complete"


def _fit(tmp_path, name: str, other_callback, **callback_options):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 16)).astype("float32"), rng.integers(0, 4, size=64).astype("int32")
    model = tf.keras.Sequential([tf.keras.Input(shape=(16,)), tf.keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    options = {"profile_steps": "1:100", "sample": False, "quiet": True, "batch_size": 16, **callback_options}
    callback = profiler.KerasCallback(tmp_path, run_name=name, **options)
    fit = dict(
        batch_size=16, epochs=2, validation_data=(x[:32], y[:32]), verbose=0, callbacks=[callback, other_callback]
    )
    return model, callback, fit, x, y


class _RaiseIn:
    """A callback that raises `error` in hook `hook` (once)."""

    def __new__(cls, hook: str, error: BaseException):
        import keras

        def raise_once(self, *args, **kwargs):
            if not self.raised:
                self.raised = True
                raise error

        callback = type("RaiseIn", (keras.callbacks.Callback,), {hook: raise_once})()
        callback.raised = False
        return callback


@pytest.mark.slow
@pytest.mark.parametrize(
    "hook, error, status",
    [
        ("on_epoch_end", ValueError("another callback failed"), "failed"),
        ("on_test_batch_end", KeyboardInterrupt(), "interrupted"),  # Ctrl-C during validation
    ],
)
def test_keras_callback_records_a_fit_stopped_by_another_callback_and_keeps_the_trace(tmp_path, hook, error, status):
    model, callback, fit, x, y = _fit(tmp_path, "stopped", _RaiseIn(hook, error))
    with pytest.raises(type(error)):
        model.fit(x, y, **fit)
    path = tmp_path / "stopped"
    meta = read_meta(path)
    assert meta["status"] == status, meta
    if status == "failed":
        assert meta["error"] == "ValueError: another callback failed"
    assert meta["profiler"].get("cut_short") and meta["profiler"].get("trace"), meta["profiler"]
    assert list(path.glob("plugins/profile/*/*.xplane.pb")), "the trace was lost"
    assert len(pd.read_csv(path / "steps.csv")) == 4  # the first epoch's steps
    assert "evaluate" not in vars(model)  # fit's own functions are the model's again
    model.fit(
        x,
        y,
        **{
            **fit,
            "callbacks": [profiler.KerasCallback(tmp_path, run_name="again", sample=False, quiet=True, batch_size=16)],
        },
    )
    assert read_meta(tmp_path / "again")["status"] == "complete"  # the stopped session let go of the process


@pytest.mark.slow
def test_keras_callback_run_left_open_by_fit_ends_with_the_program(tmp_path):
    """Another callback fails in on_train_begin, after this one started its run: nothing of fit()
    runs again, and the run ends as failed when the program ends."""
    script = f"""
import numpy as np, tensorflow as tf, profiler

class Fails(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        raise ValueError("a callback that cannot start")

model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss="mse")
callback = profiler.KerasCallback({str(tmp_path)!r}, run_name="open", sample=False, quiet=True, batch_size=8)
model.fit(np.zeros((16, 4), "float32"), np.zeros((16, 2), "float32"), batch_size=8, verbose=0,
          callbacks=[callback, Fails()])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 1 and "a callback that cannot start" in done.stderr, done.stderr[-2000:]
    meta = read_meta(tmp_path / "open")
    assert meta["status"] == "failed" and meta["error"] == "ValueError: a callback that cannot start", meta


@pytest.mark.slow
def test_using_a_session_after_its_block_is_an_error_not_silence(tmp_path):
    with quiet_session(tmp_path, "ended") as session:
        _fake_batches(session, 2)
    before = (tmp_path / "ended" / "run.json").read_text()
    for what, use in (
        ("session.step()", lambda: session.step().__enter__()),
        ("session.iterate()", lambda: next(session.iterate([1]))),
        ("session.epoch()", lambda: session.epoch().__enter__()),
        ("session.log()", lambda: session.log(loss=1.0)),
    ):
        with pytest.raises(RuntimeError, match=r"after the profile\(\) session ended \(run directory .*ended\)"):
            use()
    assert (tmp_path / "ended" / "run.json").read_text() == before
    assert len(pd.read_csv(tmp_path / "ended" / "steps.csv")) == 2


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [False, True])
def test_sigterm_inside_profile_ends_the_program_with_143_and_one_line(tmp_path, quiet):
    script = f"""
import os, signal, time, profiler
with profiler.profile({str(tmp_path)!r}, run_name="term", profile=False, sample=False, quiet={quiet}) as session:
    with session.step(images=1):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO)
    said = [line for line in done.stderr.splitlines() if "terminated" in line.lower() or "devprof" in line]
    assert done.returncode == 143, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    expected = "terminated (SIGTERM); run directory " + str(tmp_path / "term") + " (interrupted)"
    assert said == [("" if quiet else "devprof: ") + expected], said
    meta = read_meta(tmp_path / "term")
    assert meta["status"] == "interrupted" and meta["interrupted_by"] == "SIGTERM"


@pytest.mark.slow
def test_keras_callback_without_batch_size_says_so_once_at_fit_and_not_in_analyze(tmp_path, capsys):
    from profiler import cli

    model, callback, fit, x, y = _fit(
        tmp_path, "no-batch-size", _RaiseIn("on_predict_end", RuntimeError()), batch_size=None, profile_steps="1:3"
    )
    capsys.readouterr()
    model.fit(x, y, **fit)
    err = capsys.readouterr().err
    assert err.count("warning: KerasCallback has no batch_size") == 1, err
    meta = read_meta(tmp_path / "no-batch-size")
    assert meta["status"] == "complete" and [e["images"] for e in meta["epochs"]] == [None, None]
    assert cli.main(["analyze", str(tmp_path / "no-batch-size"), "--format", "json"]) == 0
    assert "run.json" not in capsys.readouterr().err  # nothing to say about devprof's own file
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 1"):
        profiler.KerasCallback(tmp_path, batch_size=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "how, exit_code, says",
    [
        (
            "ctypes.string_at(0)",
            -11,
            "its process crashed (Fatal Python error: Segmentation fault; every thread's stack is in crash.log)",
        ),
        ("os.abort()", -6, "its process crashed (Fatal Python error: Aborted"),
        ("os.kill(os.getpid(), signal.SIGKILL)", -9, "is gone without recording how it ended (killed with SIGKILL"),
        ("pass", 0, None),
    ],
)
def test_a_process_killed_by_a_fatal_signal_is_not_called_still_running(tmp_path, capsys, how, exit_code, says):
    """No `finally` outlives a segfault, an abort or SIGKILL: run.json stays `running`. analyze says
    how the process ended (its crash.log, or its pid gone on this host), not that it still runs."""
    from profiler import cli

    script = f"""
import ctypes, os, signal, profiler
with profiler.profile({str(tmp_path)!r}, run_name="crash", profile=False, sample=False, quiet=True) as session:
    for _ in range(4):
        with session.step(images=8):
            pass
    {how}
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == exit_code, done.stderr[-2000:]
    run = tmp_path / "crash"
    assert read_meta(run)["status"] == ("complete" if says is None else "running")
    crash_log = run / "crash.log"  # empty until a fatal signal; removed at a clean end, left by SIGKILL
    assert crash_log.exists() == (exit_code != 0)
    assert (exit_code != 0 and crash_log.stat().st_size > 0) == (exit_code in (-11, -6))
    assert len(pd.read_csv(run / "steps.csv")) >= 3  # the last step's row waits for the next step's start
    assert cli.main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert "still running" not in out
    if says is not None:
        assert "the run ended without recording its end (run.json status 'running'): " in out and says in out, out


@pytest.mark.slow
def test_sessions_started_in_the_same_second_without_a_name_each_get_a_folder(tmp_path):
    """Default names are stamped to the second; a loop of short sessions raised RunExistsError."""
    for _ in range(3):
        with profiler.profile(tmp_path, profile=False, sample=False, quiet=True) as session:
            with session.step(images=1):
                pass
    folders = sorted(tmp_path.iterdir())
    assert len(folders) == 3 and all(read_meta(folder)["status"] == "complete" for folder in folders), folders


@pytest.mark.slow  # imports TensorFlow
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"profile_steps": "x"}, "profile_steps"),
        ({"sample_interval": 0}, "sample_interval"),
        ({"run_name": "a/b"}, "run_name"),
    ],
)
def test_keras_callback_refuses_a_wrong_option_when_made_not_when_fit_starts(tmp_path, options, named):
    with pytest.raises(ValueError, match=named):
        profiler.KerasCallback(tmp_path, **options)
    assert not list(tmp_path.iterdir())  # nothing was written


# ---------------------------------------------------------------- step() counts are whole numbers


@pytest.mark.parametrize("images", [-1, 1.9, float("nan"), float("inf"), True, "32", [32]])
def test_step_images_must_be_a_whole_number_of_examples(tmp_path, images):
    session = profiler.profile(tmp_path / "runs")  # not entered: nothing is written
    with pytest.raises(ValueError, match=r"images must be a whole number >= 0 \(got "):
        session.step(images=images)
    assert not (tmp_path / "runs").exists()


def test_step_counts_that_are_whole_numbers_are_taken(tmp_path):
    session = profiler.profile(tmp_path / "runs")
    for images in (0, 32, np.int64(32), 32.0):
        assert session.step(images=images).images == int(images)
    assert session.step(steps=np.int32(4)).steps == 4
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        session.step(steps=2.5)


# ---------------------------------------------------------------- profile()'s errors in its own terms


def test_profile_errors_name_its_arguments_not_devprof_runs_options(tmp_path):
    from profiler.record.rundir import OutputError, RunExistsError

    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "a-file").write_text("")
    cases = [
        (dict(out=tmp_path / "runs", run_name="taken"), RunExistsError, "choose another run_name or out"),
        (dict(out=tmp_path / "a-file"), OutputError, "out "),
        (dict(out=tmp_path / "runs", run_name="a/b"), ValueError, "folder name inside out, not a path"),
        (dict(out=tmp_path / "runs", profile_steps="x"), ValueError, "profile_steps wants START:STOP"),
    ]
    for kwargs, kind, words in cases:
        with pytest.raises(kind) as raised:
            with profiler.profile(**kwargs):
                pass
        assert words in str(raised.value) and "--" not in str(raised.value), str(raised.value)
    assert profiler.RunExistsError is RunExistsError and profiler.OutputError is OutputError  # documented names
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["taken"]


def test_a_session_not_entered_records_nothing_and_says_so(tmp_path):
    session = profiler.profile(tmp_path / "runs")
    for what, use in (
        ("session.step()", lambda: session.step().__enter__()),
        ("session.iterate()", lambda: next(session.iterate([1]))),
        ("session.epoch()", lambda: session.epoch().__enter__()),
        ("session.log()", lambda: session.log(loss=1.0)),
    ):
        with pytest.raises(
            RuntimeError,
            match=f"{what.replace('(', '[(]').replace(')', '[)]')} outside the profile\\(\\) session's with block",
        ):
            use()
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- an out that is no path; a program that ends with os._exit


@pytest.mark.parametrize("out", [None, 7, b"runs"])
def test_profile_out_that_is_no_path_is_a_type_error_not_a_folder_named_after_it(tmp_path, monkeypatch, out):
    """`profile(out=None)` wrote its run into ./None/."""
    import profiler

    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="out must be a folder path"):
        profiler.profile(out, run_name="x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_program_that_calls_os_exit_leaves_a_failed_run_with_its_steps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(f"""
import os
import profiler

with profiler.profile({str(tmp_path / "runs")!r}, run_name="exits", profile=False, sample=False, quiet=True) as s:
    for step in range(3):
        with s.step(images=8):
            pass
    os._exit(3)
""")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert proc.returncode == 3, proc.stderr.decode()
    run = tmp_path / "runs" / "exits"
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "failed" and "os._exit(3)" in meta["error"], meta.get("status")
    assert len((run / "steps.csv").read_text().strip().splitlines()) == 1 + 3
