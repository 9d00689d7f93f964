"""Advice on a new user's own programs: what the loop waits for is input whoever makes the batch, on a
trace the program wrote itself (no devprof flags in its advice)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from analysis import analyze
from trace_fixtures import _Plane, _write_space, _xspace_class

MS = 1_000_000
BASE_NS = 1_700_000_000 * 10**9


def _run_without_tf_data(root: Path, *, iterator_ms: float, steps: int = 6) -> Path:
    """A `profile()` run whose loop iterates a Python generator: steps of 20 ms with `train` markers, the
    generator's `iterator_ms` at the start of each (no tf.data event: the trace cannot see it), compute 8 ms
    (ExecutorState::Process), the rest host. steps.csv timed the generator as the loop's input."""
    run = root / "run"
    space = _xspace_class()()
    space.hostnames.append("host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    worker = host.line(101, "tf_Compute/1", BASE_NS)
    for k in range(steps):
        t = BASE_NS + 10 * MS + k * 20 * MS
        host.event(python, "train", t, t + 20 * MS, step_num=k, _r=1)
        start = t + int(iterator_ms * MS)
        host.event(worker, "ExecutorState::Process", start, start + 8 * MS)
    host.finish()
    _write_space(space, run / "plugins" / "profile" / "s" / "host.xplane.pb")
    rows = [
        f"1,{k},1,{BASE_NS / 1e9 + 0.01 + k * 0.02:.6f},{iterator_ms},8.5,{20 - iterator_ms - 8.5},20.0,32"
        for k in range(steps)
    ]
    (run / "steps.csv").write_text(
        "epoch,step,steps,start_time_s,input_ms,call_ms,other_host_ms,step_ms,images\n" + "\n".join(rows) + "\n"
    )
    (run / "run.json").write_text(
        json.dumps(
            {"status": "complete", "producer": "tensorflow", "config": {"batch_size": 32}, "device": {"kind": "cpu"}}
        )
    )
    return run


def test_a_python_iterators_wait_is_input_not_host(tmp_path):
    result = analyze(_run_without_tf_data(tmp_path, iterator_ms=7.0))
    mean = result.mean
    assert mean["input_ms"] == pytest.approx(7.0) and mean["host_ms"] == pytest.approx(20.0 - 8.0 - 7.0)
    assert mean["input_wait_ms"] == pytest.approx(7.0)
    assert any("the loop waited for its iterator 35.0 % of the step" in note for note in result.notes), result.notes
    verdict = result.verdict
    assert verdict["bound"] == "compute" and verdict["first_fix"]["rule"] == "input_wait"
    advice = verdict["first_fix"]["advice"]
    assert "a Python iterator" in advice and "from_tensor_slices" in advice and "--" not in advice


def test_a_small_disagreement_between_the_clocks_is_not_moved(tmp_path):
    result = analyze(_run_without_tf_data(tmp_path, iterator_ms=0.5))  # 2.5 % of the step: the clocks' noise
    assert result.mean["input_ms"] == pytest.approx(0.0)
    assert not any("iterator" in note for note in result.notes)


def test_a_jobs_own_worker_on_the_machine_is_not_called_another_job(tmp_path):
    from analysis.read.run_files import RunRecord
    from analysis.rules import finding_rules
    from analysis.rules.facts import job_workers_here, make_facts

    class Run:  # stands for a RunRecord: job_workers_here reads only its raw run.json
        def __init__(self, worker):
            self.raw = {"worker": worker}

    local = {"index": 1, "address": "127.0.0.1:2223", "addresses": ["127.0.0.1:2222", "127.0.0.1:2223"]}
    spread = {"index": 1, "address": "h2:2222", "addresses": ["h1:2222", "h2:2222"]}
    assert (
        job_workers_here(cast(RunRecord, Run(local))) == 1
        and job_workers_here(cast(RunRecord, Run(spread))) == 0
        and job_workers_here(None) == 0
    )
    common: dict[str, Any] = dict(
        input_pct=2.0,
        host_pct=10.0,
        compute_pct=88.0,
        other_cpu_pct=43.0,
        proc_cpu_pct=110.0,
        cpu_cores=2.0,
        device="cpu",
        producer="devprof",
    )
    found = {f["rule"]: f for f in finding_rules.findings(make_facts(**common, job_workers_here=1))}["cpu_contention"]
    assert "runs 1 other worker of the same job, which is among them" in found["evidence"]
    assert "fewer `--workers` per machine" in found["advice"] and "another job" not in found["advice"]
    alone = {f["rule"]: f for f in finding_rules.findings(make_facts(**common))}["cpu_contention"]
    assert "another job competes" in alone["advice"] and "worker" not in alone["evidence"]


def test_a_python_iterators_wait_is_advised_for_what_it_is_and_saved_whole(tmp_path):
    result = analyze(_run_without_tf_data(tmp_path, iterator_ms=7.0))
    verdict = result.verdict
    assert verdict["first_fix"]["saving_ms"] == pytest.approx(7.0)  # precomputed, the wait goes whole
    assert "Python iterator" in verdict["first_fix"]["saving_basis"]
    assert not any(".prefetch(tf.data.AUTOTUNE)` as the last stage" in line for line in verdict["advice"])
    assert any("holds the GIL" in line for line in verdict["advice"]), verdict["advice"]


def _config(run: Path, **config) -> Path:
    meta = json.loads((run / "run.json").read_text())
    meta["config"].update(config)
    (run / "run.json").write_text(json.dumps(meta))
    return run


@pytest.mark.parametrize(
    "setting, slow_config, said",
    [
        ("xla", {"jit_compile": True}, "XLA is the slower setting on this device, so leave it off"),
        (
            "precision",
            {"precision": "mixed_bfloat16"},
            "this one computes in mixed_bfloat16, the faster one in float32",
        ),
    ],
)
def test_compare_names_the_setting_that_makes_a_run_slower(tmp_path, capsys, setting, slow_config, said):
    from compare_fixtures import make_run, run_cli

    fast = make_run(tmp_path, "plain", device="Test CPU")
    slow = _config(
        make_run(tmp_path, f"with_{setting}", device="Test CPU", call_ms=300.0, epoch_seconds=(4.0, 3.0, 3.0)),
        **slow_config,
    )
    code, out, err = run_cli([fast, slow, "--format", "json"], capsys)
    assert code == 0, err
    why = {row["run"]: row["why"] for row in json.loads(out)["rows"]}[f"with_{setting}"]
    assert "compute explains" in why and said in why, why
    assert "a faster device" not in why
