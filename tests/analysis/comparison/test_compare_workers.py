"""compare on a multi-worker job: the all-reduce wait is its own part (not host overhead), and the
job's own workers on one machine are the job, not other processes taking its CPU.

The job (tests/support/job_fixtures.py) has 10 steps of 18 ms per epoch in a 0.4 s epoch; worker 0's
trace cuts its step into input 1.5 + compute 6 + collective 8 + host 2.5 ms (it waits for
worker 1's 6 ms of extra host work), worker 1's into input 1.5 + compute 6 + collective 2 + host 8.5.
"""

from __future__ import annotations

import json

import pytest

from analysis import comparison as compare
from job_fixtures import write_job
from profiler import cli

# shares of the 0.4 s epoch: 10 steps of each part, the rest (220 ms) outside the steps
WORKER0 = {"input": 3.75, "compute": 15.0, "collective": 20.0, "host": 6.25, "epoch_level": 55.0}
WORKER1 = {"input": 3.75, "compute": 15.0, "collective": 5.0, "host": 21.25, "epoch_level": 55.0}


def compare_json(capsys, *paths) -> dict:
    capsys.readouterr()
    assert cli.main(["compare", *map(str, paths), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_collective_wait_is_its_own_part_not_host_overhead(tmp_path, capsys):
    job = write_job(tmp_path)
    row = compare_json(capsys, job.path)["rows"][0]
    for part, pct in WORKER0.items():
        assert row[f"{part}_pct"] == pytest.approx(pct), part
        assert row[f"{part}_s"] == pytest.approx(0.4 * pct / 100), part
    assert sum(row[f"{p}_s"] for p in compare.COMPONENTS) == pytest.approx(row["seconds_per_epoch"])
    assert row["collective_ms_per_image"] == pytest.approx(1000 * 0.08 / 500)  # 80 ms over 10 x 50 images
    # a job whose chief waits 20 % of its epoch in the all-reduce is collective-bound, not host-bound:
    # no --steps-per-execution, and no host_bound finding
    assert row["bound"] == "collective"
    assert "steps-per-execution" not in row["why"] and "host-bound" not in row["why"]
    assert "collective wait 20 %" in row["why"]
    workers = {w["run"]: w for w in row["workers"]}
    assert workers["worker-0"]["collective_pct"] == pytest.approx(WORKER0["collective"])
    assert workers["worker-0"]["host_pct"] == pytest.approx(WORKER0["host"])
    assert workers["worker-1"]["collective_pct"] == pytest.approx(WORKER1["collective"])
    assert workers["worker-1"]["host_pct"] == pytest.approx(WORKER1["host"])


@pytest.mark.parametrize(
    "fmt, check",
    [
        (
            "text",
            lambda out: (
                "collective%" in out.splitlines()[0]
                and " 20.0 " in out.splitlines()[1]
                and "worker-0: 0.4 s/epoch, input 4 %, compute 15 %, collective 20 %, host 6 %" in out
            ),
        ),
        ("markdown", lambda out: "| collective% |" in out and "| 20.0 |" in out),
        ("csv", lambda out: "collective_pct" in out.splitlines()[0].split(",")),
        ("html", lambda out: "collective wait" in out and "collective 20 %" in out),
    ],
)
def test_every_format_of_compare_shows_the_collective_part(tmp_path, capsys, fmt, check):
    job = write_job(tmp_path)
    capsys.readouterr()
    assert cli.main(["compare", str(job.path), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert check(out), out


def test_runs_without_collectives_show_no_collective_column(tmp_path, capsys):
    from compare_fixtures import make_run

    run = make_run(tmp_path, "single")
    capsys.readouterr()
    assert cli.main(["compare", str(run)]) == 0
    out = capsys.readouterr().out
    assert "collective" not in out
    row = compare_json(capsys, run)["rows"][0]
    assert row["collective_s"] == 0.0 and row["collective_pct"] == 0.0


@pytest.mark.parametrize("proc_cpu_pct, other_pct", [(100.0, 0.0), (50.0, 50.0)])
def test_the_jobs_own_workers_are_not_other_processes(tmp_path, capsys, proc_cpu_pct, other_pct):
    """Two workers on a 2-core machine at 100 % CPU: each worker's process took `proc_cpu_pct` of a
    core. At 100 each the job is the whole load (nothing else ran); at 50 each, half the machine
    went to other processes, and that is still contention."""
    job = write_job(tmp_path, cpu_pct=100.0, proc_cpu_pct=proc_cpu_pct)
    row = compare_json(capsys, job.path)["rows"][0]
    assert row["proc_cpu_mean_pct"] == pytest.approx(2 * proc_cpu_pct)  # both workers: the job
    assert row["other_cpu_mean_pct"] == pytest.approx(other_pct)
    contention = [f for f in row["findings"] if f["rule"] == "cpu_contention"]
    assert bool(contention) == (other_pct > 0)
    # analyze says the same of the job
    capsys.readouterr()
    assert cli.main(["analyze", str(job.path), "--format", "json"]) == 0
    utilization = json.loads(capsys.readouterr().out)["utilization"]
    assert utilization["other_cpu_mean_pct"] == pytest.approx(other_pct)


def test_workers_on_other_hosts_are_not_counted_as_the_chiefs_job(tmp_path, capsys):
    """Worker 1 on another machine: its CPU is not the chief's machine's, so it is not subtracted."""
    job = write_job(tmp_path, cpu_pct=100.0, proc_cpu_pct=100.0)
    meta_path = job.path / "worker-1" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["device"]["host"] = "other-host"
    meta_path.write_text(json.dumps(meta))
    row = compare_json(capsys, job.path)["rows"][0]
    assert row["proc_cpu_mean_pct"] == pytest.approx(100.0)
    assert row["other_cpu_mean_pct"] == pytest.approx(50.0)
