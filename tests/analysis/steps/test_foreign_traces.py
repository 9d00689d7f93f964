"""Right on traces devprof did not make: each test reproduces one way real GPU/TPU traces
differ from devprof's own (tests/support/truth_fixtures.py) and checks the figure against what the
fixture put there, to the nanosecond."""

from __future__ import annotations

import pytest

import truth_fixtures as tf_fx
from analysis import analyze

EXACT_MS = 1e-6
DEVICE_PARTS = ("compute_ms", "input_ms", "copy_ms", "collective_ms", "idle_ms")


def _json(path):
    return analyze(path).to_json()


def _advice_text(data) -> str:
    return " ".join([*data["verdict"]["advice"], *(f["advice"] for f in data["findings"]), data["verdict"]["evidence"]])


def test_a_gpu_plane_without_events_is_not_recorded_and_not_judged(tmp_path):
    made = tf_fx.write_tf_gpu_loop(tmp_path / "h.xplane.pb", record_gpu=False)
    data = _json(made.path)
    assert data["device"] == "gpu"
    (row,) = data["devices"]
    assert row["recorded"] is False and row["idle"] is None and row["compute_ms"] is None, row
    notes = " ".join(data["notes"])
    assert "not recorded" in notes and "CUPTI" in notes and "--device-tracer-level" in notes
    assert data["verdict"]["bound"] is None and "not recorded" in data["verdict"]["reason"]
    assert "CPU" not in _advice_text(data), _advice_text(data)


def test_input_bound_still_judged_when_the_device_is_not_recorded(tmp_path):
    made = tf_fx.write_tf_gpu_loop(tmp_path / "h.xplane.pb", record_gpu=False, input_wait_ms=2.5)
    data = _json(made.path)
    # step 0, the first call, is no steady step: the mean is of the later ones, the last ending with its marker
    assert data["mean"]["input_pct"] == pytest.approx(100 * 2.5 / 5.0, abs=0.2)
    assert data["verdict"]["bound"] == "input"


def test_a_device_running_behind_the_host_keeps_its_own_steps(tmp_path):
    # The host queues a step every 5 ms; the GPU needs 8: step k's kernels run during host
    # steps k+1, k+2, ... Cut by host intervals the GPU would show 5 ms steps.
    made = tf_fx.write_tf_gpu_loop(
        tmp_path / "h.xplane.pb", host_step_ms=5.0, device_period_ms=8.0, kernels_ms=(4.0, 3.0), kernel_gap_ms=1.0
    )
    data = _json(made.path)
    (row,) = data["devices"]
    assert row["recorded"] is True and row["grouping"] == "launches"
    assert row["step_ms"] == pytest.approx(made.device_step_ms, abs=EXACT_MS)
    assert row["compute_ms"] == pytest.approx(made.device_compute_ms, abs=EXACT_MS)
    assert row["idle_ms"] == pytest.approx(1.0, abs=EXACT_MS)
    assert row["step_ms"] == pytest.approx(sum(row[key] for key in DEVICE_PARTS), abs=EXACT_MS)
    assert data["mean"]["device_step_ms"] == pytest.approx(made.device_step_ms, abs=EXACT_MS)
    assert data["steps"][0]["step_ms"] == pytest.approx(made.host_step_ms, abs=EXACT_MS)
    assert data["verdict"]["step_basis"] == "host"
    assert row["step_count"] == data["steps_used"]


def test_every_device_event_belongs_to_one_step_or_to_outside_steps(tmp_path):
    made = tf_fx.write_tf_gpu_loop(tmp_path / "h.xplane.pb", steps=5, device_period_ms=8.0)
    result = analyze(made.path)
    row = result.devices.iloc[0]
    used = result.steps_used
    # Busy device time: in the steps the means cover, plus the remainder outside complete steps.
    busy_in_steps = (row["compute_ms"] + row["copy_ms"] + row["input_ms"] + row["collective_ms"]) * used
    total_busy = made.steps * made.device_compute_ms
    compile_steps = len(result.steps) - used - int(result.steps["partial"].sum())
    assert busy_in_steps + row["outside_steps_ms"] + compile_steps * made.device_compute_ms == pytest.approx(
        total_busy, abs=1e-3
    )


def test_the_device_steps_line_is_the_step_even_when_it_has_one_event(tmp_path):
    path = tf_fx.write_one_step_capture(tmp_path / "h.xplane.pb", step_ms=63.0)
    data = _json(path)
    assert data["step_source"] == "trace_groups" and len(data["steps"]) == 1
    assert data["steps"][0]["step_ms"] == pytest.approx(63.0, abs=EXACT_MS)
    assert data["mean"]["step_ms"] == pytest.approx(63.0, abs=EXACT_MS)
    assert data["verdict"]["step_basis"] == "device"
    (row,) = data["devices"]
    assert row["grouping"] in ("group_id", "steps_line") and row["step_ms"] == pytest.approx(63.0, abs=EXACT_MS)


def test_copies_under_the_kernels_are_not_input(tmp_path):
    made = tf_fx.write_tf_gpu_loop(
        tmp_path / "h.xplane.pb",
        host_step_ms=10.0,
        device_period_ms=10.0,
        device_lag_ms=0.5,
        kernels_ms=(6.0, 2.5),
        kernel_gap_ms=0.5,
        overlapped_copy_ms=2.0,
        input_wait_ms=0.2,
    )
    data = _json(made.path)
    assert data["mean"]["input_ms"] == pytest.approx(0.2, abs=EXACT_MS)  # only the host's wait
    assert data["mean"]["input_overlapped_ms"] == pytest.approx(2.0, abs=EXACT_MS)
    assert data["verdict"]["bound"] != "input", data["verdict"]
    (row,) = data["devices"]
    assert row["input_ms"] == pytest.approx(0.0, abs=EXACT_MS)
    assert row["input_overlapped_ms"] == pytest.approx(2.0, abs=EXACT_MS)


def test_program_executions_are_one_program_by_its_module(tmp_path):
    programs = [
        "jit_init",
        *(["jit_train_step", "jit_eval_step"] * 2),
        "jit_train_step",
        "jit_eval_step",
        "jit_train_step",
        "jit_train_step",
        "jit_log",
    ]
    # The training step is most of the device's work (5 x 3.0 ms of 17.2 ms: 87 %), evaluation a forward pass.
    kernels = {"jit_train_step": 3.0, "jit_eval_step": 0.5, "jit_init": 0.2, "jit_log": 0.2}
    path = tf_fx.write_jax_programs(tmp_path / "h.xplane.pb", programs, kernel_ms=kernels)
    data = _json(path)
    assert data["step_source"] == "program_executions"
    assert data["step_name"] == "jit_train_step"
    assert len(data["steps"]) == programs.count("jit_train_step")


def test_programs_that_never_repeat_are_the_window(tmp_path):
    path = tf_fx.write_jax_programs(tmp_path / "h.xplane.pb", ["jit_a", "jit_b", "jit_c"])
    data = _json(path)
    assert data["step_source"] == "window" and len(data["steps"]) == 1
    assert any("nothing repeats" in note for note in data["notes"])


def test_a_jax_program_gets_jax_advice(tmp_path):
    path = tf_fx.write_jax_programs(tmp_path / "h.xplane.pb", ["jit_train_step"] * 6, execute_ms=1.0, gap_ms=4.0)
    data = _json(path)
    assert data["verdict"]["bound"] == "host"
    advice = _advice_text(data)
    assert "jax.lax.scan" in advice or "fori_loop" in advice, advice
    for wrong in ("--steps-per-execution", "model.compile", "tf.function", "--batch-size", "tf.data"):
        assert wrong not in advice, (wrong, advice)


def test_a_gpu_run_is_not_told_about_cpu_units(tmp_path):
    made = tf_fx.write_tf_gpu_loop(
        tmp_path / "h.xplane.pb",
        host_step_ms=8.0,
        device_period_ms=8.0,
        device_lag_ms=0.3,
        kernels_ms=(5.0, 2.4),
        kernel_gap_ms=0.1,
    )
    data = _json(made.path)
    assert data["device"] == "gpu" and data["verdict"]["bound"] == "compute", data["verdict"]
    advice = _advice_text(data)
    assert "mixed_float16" in advice and "CPU" not in advice and "bfloat16 matrix units" not in advice, advice
    assert "--precision" not in advice  # a custom TensorFlow loop, not devprof's own


def test_host_parts_add_up_and_device_parts_add_up_on_every_truth_trace(tmp_path):
    paths = [
        tf_fx.write_tf_gpu_loop(tmp_path / "a.xplane.pb").path,
        tf_fx.write_tf_gpu_loop(tmp_path / "b.xplane.pb", record_gpu=False).path,
        tf_fx.write_tf_gpu_loop(tmp_path / "c.xplane.pb", overlapped_copy_ms=1.0, device_period_ms=5.0).path,
        tf_fx.write_one_step_capture(tmp_path / "d.xplane.pb"),
        tf_fx.write_jax_programs(tmp_path / "e.xplane.pb", ["jit_step"] * 4),
    ]
    for path in paths:
        data = _json(path)
        for step in data["steps"]:
            parts = step["input_ms"] + step["compute_ms"] + step["collective_ms"] + step["host_ms"]
            assert parts == pytest.approx(step["step_ms"], abs=EXACT_MS), (path, step)
        for row in data["devices"]:
            if row["recorded"]:
                assert row["step_ms"] == pytest.approx(sum(row[k] for k in DEVICE_PARTS), abs=EXACT_MS), row


def test_a_device_whose_events_stop_mid_window_is_not_recorded(tmp_path):
    made = tf_fx.write_tf_gpu_loop(
        tmp_path / "h.xplane.pb", steps=8, host_step_ms=8.0, device_period_ms=8.0, device_lag_ms=0.5, gpu_stops_after=3
    )
    data = _json(made.path)
    (row,) = data["devices"]
    assert row["recorded"] is False and row["idle"] is None and row["step_ms"] is None, row
    assert any("not recorded after" in note for note in data["notes"]), data["notes"]


def test_groups_of_callbacks_are_not_steps(tmp_path):
    path = tf_fx.write_grouped_with_callbacks(tmp_path / "h.xplane.pb", steps=4)
    data = _json(path)
    assert data["step_source"] == "trace_groups" and len(data["steps"]) == 4, data["steps"]
    assert all(step["input_ms"] == pytest.approx(1.0, abs=EXACT_MS) for step in data["steps"])


def test_tpu_cores_behind_the_host_keep_their_own_program_steps(tmp_path):
    # The host dispatches every 5 ms; each core runs an 8 ms program: core step k runs during
    # host steps k+1 and later. Each core's steps are its own module executions.
    path = tf_fx.write_jax_tpu_async(tmp_path / "h.xplane.pb", host_period_ms=5.0, device_program_ms=8.0, op_ms=6.0)
    data = _json(path)
    assert data["device"] == "tpu x2"
    for row in data["devices"]:
        assert row["grouping"] == "programs", row
        assert row["step_ms"] == pytest.approx(8.0, abs=EXACT_MS), row
        assert row["compute_ms"] == pytest.approx(6.0, abs=EXACT_MS) and row["idle_ms"] == pytest.approx(
            2.0, abs=EXACT_MS
        )
        assert row["step_count"] == data["steps_used"]


def test_device_groups_finer_than_the_markers_are_the_devices_own_steps(tmp_path):
    # Each 40 ms marker holds two XProf groups; on every GPU a group runs 15 ms of kernels within
    # its own 19 ms. Merged by host step the GPUs would show 40 ms steps.
    path = tf_fx.write_groups_finer_than_markers(
        tmp_path / "h.xplane.pb", steps=5, groups_per_step=2, kernel_ms=15.0, group_span_ms=20.0
    )
    data = _json(path)
    assert data["step_source"] == "markers" and data["mean"]["step_ms"] == pytest.approx(40.0, abs=0.02)
    for row in data["devices"]:
        assert row["grouping"] == "group_id", row
        assert row["step_ms"] == pytest.approx(19.0, abs=EXACT_MS), row
        assert row["compute_ms"] == pytest.approx(15.0, abs=EXACT_MS), row
        assert row["step_count"] == 2 * data["steps_used"], row


# ------------------------------------------------------------------ Keras' own step, one-step captures


def test_keras_train_function_group_is_the_step_on_a_cpu(tmp_path):
    # One profiled step, no step marker: the step is the group TensorFlow recorded inside
    # train_function (6.4 ms), not the 8.2 ms window whose summary flush would be host overhead.
    made = tf_fx.write_keras_cpu_capture(tmp_path / "h.xplane.pb")
    data = _json(made.path)
    assert data["step_source"] == "trace_groups" and len(data["steps"]) == 1, data["notes"]
    (step,) = data["steps"]
    assert step["step_ms"] == pytest.approx(made.step_ms, abs=EXACT_MS)
    assert step["input_ms"] == pytest.approx(made.input_ms, abs=EXACT_MS)
    assert step["compute_ms"] == pytest.approx(made.compute_ms, abs=EXACT_MS)  # train_function's own time is dispatch
    assert step["host_ms"] == pytest.approx(made.step_ms - made.input_ms - made.compute_ms, abs=EXACT_MS)
    assert data["verdict"]["bound"] == "compute", data["verdict"]
    assert any("train_function" in note for note in data["notes"]), data["notes"]


def test_keras_evaluation_groups_are_not_training_steps(tmp_path):
    made = tf_fx.write_keras_cpu_capture(tmp_path / "h.xplane.pb", evaluation=True)
    data = _json(made.path)
    assert data["step_source"] == "trace_groups" and len(data["steps"]) == 1, data["steps"]
    assert data["steps"][0]["step_ms"] == pytest.approx(made.step_ms, abs=EXACT_MS)


def test_keras_groups_span_their_root_not_the_eager_ops_after_it(tmp_path):
    # Four steps 10 ms apart: a Keras step is its train_function's work (the group's root, 6.4 ms); the
    # summary ops TensorFlow puts in the group after the call, and the next call's dispatch, are between steps.
    made = tf_fx.write_keras_cpu_capture(tmp_path / "h.xplane.pb", steps=4)
    data = _json(made.path)
    assert [round(s["step_ms"], 6) for s in data["steps"]] == [made.step_ms] * 4
    assert [round(s["between_steps_ms"], 6) for s in data["steps"]] == [3.6, 3.6, 3.6, 0.55]
    assert all(s["compute_ms"] == pytest.approx(made.compute_ms, abs=EXACT_MS) for s in data["steps"])


@pytest.mark.parametrize("steps", [1, 3])
def test_a_keras_group_running_on_into_the_callbacks_ends_with_train_function(tmp_path, steps):
    # No `_r` root: the group's own events run 2 ms past train_function into the TensorBoard callback's
    # WriteSummary. The step is the call's work from the group's start (6.4 ms and the call's 0.2 ms tail),
    # not the group's span; the summary is between steps, named in a note.
    made = tf_fx.write_keras_cpu_capture(tmp_path / "h.xplane.pb", steps=steps, root_marker=False, summary_ms=2.0)
    data = _json(made.path)
    assert [s["step_ms"] for s in data["steps"]] == pytest.approx([6.6] * steps, abs=1e-3)
    assert data["steps"][-1]["between_steps_ms"] == pytest.approx(2.32, abs=1e-3)  # a 0.3 ms gap, a 2.02 ms summary
    assert data["mean"]["host_ms"] == pytest.approx(6.6 - made.input_ms - made.compute_ms, abs=1e-3)
    note = next(n for n in data["notes"] if n.startswith("between the steps"))
    assert "WriteSummary:WriteSummary 2.00 ms" in note and "train_function" in note.split("heaviest")[0]


def test_one_keras_train_function_call_without_groups_is_the_step(tmp_path):
    made = tf_fx.write_keras_cpu_capture(tmp_path / "h.xplane.pb", groups=False)
    data = _json(made.path)
    assert data["step_source"] == "program_executions" and len(data["steps"]) == 1, data["notes"]
    assert data["steps"][0]["step_ms"] == pytest.approx(made.call_ms, abs=EXACT_MS)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_one_step_capture_gets_a_verdict_marked_single_step_in_every_format(tmp_path, device):
    if device == "cpu":
        path = tf_fx.write_keras_cpu_capture(tmp_path / "h.xplane.pb").path
    else:
        path = tf_fx.write_one_step_capture(tmp_path / "h.xplane.pb", step_ms=63.0)
    result = analyze(path)
    verdict = result.to_json()["verdict"]
    assert verdict["bound"] is not None and verdict["single_step"] is True, verdict
    assert "single step" in verdict["evidence"]
    for fmt in ("text", "markdown", "html"):
        assert "Based on a single step" in " ".join(result.render(fmt).split()), fmt


def test_a_one_step_capture_that_compiles_gets_no_verdict(tmp_path):
    made = tf_fx.write_tf_gpu_loop(tmp_path / "h.xplane.pb", steps=1, compile_ms=2.0)
    data = _json(made.path)
    assert len(data["steps"]) == 1 and data["verdict"]["bound"] is None
    assert "single_step" not in data["verdict"]


def test_several_steps_are_not_marked_single_step(tmp_path):
    made = tf_fx.write_tf_gpu_loop(tmp_path / "h.xplane.pb", steps=6)
    verdict = _json(made.path)["verdict"]
    assert verdict["bound"] is not None and "single_step" not in verdict


# ------------------------------------------------------------------ every execution counts; the work decides the unit


def test_a_program_that_is_not_most_of_the_device_work_is_not_the_step(tmp_path):
    # jit_matmul runs most often (12 times, 0.3 ms each: 3.6 ms) but jit_softmax (6 x 0.8 ms) and
    # jit_add (6 x 0.2 ms) hold the rest: 3.6 of 9.6 ms is 37.5 %. Steps of jit_matmul would leave
    # 62.5 % of the GPU's work outside every step; the window is one step and holds all 9.6 ms.
    programs = ["jit_matmul", "jit_matmul", "jit_softmax", "jit_add"] * 6
    kernels = {"jit_matmul": 0.3, "jit_softmax": 0.8, "jit_add": 0.2}
    path = tf_fx.write_jax_programs(tmp_path / "h.xplane.pb", programs, kernel_ms=kernels)
    data = _json(path)
    assert data["step_source"] == "window" and len(data["steps"]) == 1, data["notes"]
    note = next(n for n in data["notes"] if "jit_matmul" in n)
    for listed in (
        "jit_matmul 12 executions, 37.5 %",
        "jit_softmax 6 executions, 50.0 %",
        "jit_add 6 executions, 12.5 %",
        "75 %",
    ):
        assert listed in note, (listed, note)
    (row,) = data["devices"]
    assert row["outside_steps_ms"] == pytest.approx(0.0, abs=EXACT_MS)
    assert row["compute_ms"] == pytest.approx(9.6, abs=EXACT_MS)


def test_tpu_steps_are_one_programs_executions_each_counted_on_every_core(tmp_path):
    # Four cores each run jit_f(5) six times (7.84 ms, 7.0 of XLA Ops) with two quick helper programs
    # after each; every launch is a TfrtTpuLoadedExecutable::Execute carrying only a program_id. The
    # profiler started during the first execution: that round is partial, not lost.
    made = tf_fx.write_tpu_programs(tmp_path / "h.xplane.pb", cores=4, executions=6)
    data = _json(made.path)
    assert data["step_source"] == "program_executions" and data["step_name"] == "jit_f(5)", data["notes"]
    assert len(data["steps"]) == made.executions
    assert [s["partial"] for s in data["steps"]] == [True] + [False] * (made.executions - 1)
    assert data["device"] == "tpu x4" and len(data["devices"]) == made.cores
    for row in data["devices"]:
        assert row["grouping"] == "programs" and row["step_count"] == made.executions - 1, row
        assert row["step_ms"] == pytest.approx(made.program_ms, abs=EXACT_MS)
        assert row["compute_ms"] == pytest.approx(made.busy_ms, abs=EXACT_MS)
        # outside the complete steps: the cut first execution's 3.92 ms and the helpers' 12 x 0.05 ms
        assert row["outside_steps_ms"] == pytest.approx(made.program_ms / 2 + 0.6, abs=EXACT_MS)


def test_every_execution_of_a_tpu_program_is_a_device_step_whatever_the_host_clock(tmp_path):
    # Three executions of one 75.8 us program; the host's launches are recorded 0.1 ms after each
    # execution starts on the TPU (the two clocks differ). All three are device steps: 0.2274 ms busy.
    made = tf_fx.write_tpu_programs(
        tmp_path / "h.xplane.pb",
        cores=1,
        executions=3,
        program_ms=0.0758,
        op_ms=0.0758,
        helpers=(),
        cut_first=False,
        launch_lead_ms=-0.1,
        period_ms=0.3,
    )
    data = _json(made.path)
    (row,) = data["devices"]
    assert row["step_count"] == 3 and row["outside_steps_ms"] == pytest.approx(0.0, abs=EXACT_MS), row
    assert row["step_count"] * row["compute_ms"] == pytest.approx(3 * 0.0758, abs=EXACT_MS)
    assert not any(step["partial"] for step in data["steps"])


def test_a_launch_names_its_program_by_its_own_stats(tmp_path):
    # Host launches alone (no XLA Modules line): the program_id they carry tells jit_f's launches
    # from the helpers', so the steps are jit_f's six rounds, not every launch.
    made = tf_fx.write_tpu_programs(
        tmp_path / "h.xplane.pb", cores=2, executions=6, cut_first=False, device_programs=False
    )
    data = _json(made.path)
    assert data["step_source"] == "program_executions" and data["step_name"] == "program(5)", data["notes"]
    assert len(data["steps"]) == made.executions


def test_of_programs_run_as_often_the_one_that_is_the_work_is_the_step(tmp_path):
    # Training and evaluation alternate, four each; training is 12 of the device's 14 ms (86 %).
    programs = ["jit_eval_step", "jit_train_step"] * 4
    path = tf_fx.write_jax_programs(
        tmp_path / "h.xplane.pb", programs, kernel_ms={"jit_train_step": 3.0, "jit_eval_step": 0.5}
    )
    data = _json(path)
    assert data["step_source"] == "program_executions" and data["step_name"] == "jit_train_step", data["notes"]
    assert len(data["steps"]) == 4
