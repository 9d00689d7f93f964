"""A job of many workers: a straggler score and clock offset for every worker, the slowest few
with their cause, the spread of step time across workers, per-worker faults, and the per-worker
analysis run on any executor (a Dask cluster on loopback in the slow tests)."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import executors, pipeline
from analysis.breakdown import workers
from analysis.job import WorkerSummary
from analysis.rules import straggler as straggler_rule
from cluster_fixtures import OFFSET_MS, DaskCluster, _free_port, write_job
from profiler import cli
from profiler.cli import main
from repo_paths import REPO

# Every worker's step (write_synthetic_device_trace): gap 2 + input copy 1.5 + kernels 6 + copy 0.5 = 10 ms
# of its own, then the all-reduce, which ends at the same moment for all: the slowest worker's extra
# time is the others' extra wait.
OWN_MS = 10.0


@pytest.fixture(scope="module")
def job16(tmp_path_factory):
    return write_job(tmp_path_factory.mktemp("cluster"))


@pytest.fixture(scope="module")
def local16(job16):
    return pipeline.analyze(job16.path, processes=1)


def test_every_worker_gets_a_straggler_score_and_clock_offset(local16):
    workers = local16.workers.set_index("worker")
    assert len(workers) == 16 and (workers["status"] == "ok").all()
    expected = {i: 0.0 for i in range(16)}
    expected.update({5: 1 - OWN_MS / 16.0, 11: 1 - OWN_MS / 13.0})  # steady workers: pace alone
    assert workers["straggler_score"].to_dict() == pytest.approx(expected, abs=1e-9)
    assert workers["clock_offset_ms"].to_dict() == pytest.approx({i: i * OFFSET_MS for i in range(16)}, abs=1e-6)
    assert local16.straggler["worker"] == 5 and local16.straggler["cause"] == "host"


def test_the_slowest_workers_come_with_their_cause_and_the_spread_across_workers(local16):
    slowest = local16.slowest_workers
    assert len(slowest) == 10
    assert [(s["worker"], s["cause"]) for s in slowest[:2]] == [(5, "host"), (11, "input")]
    assert slowest[0]["excess_ms"] == pytest.approx(6.0) and slowest[1]["excess_ms"] == pytest.approx(3.0)
    assert slowest[1]["own_step_ms"] == pytest.approx(13.0)
    assert all(s["cause"] is None for s in slowest[2:])
    spread = local16.worker_distribution
    # 14 workers at 10 ms, one at 13, one at 16: the 90th percentile falls between 10 and 13
    assert spread["own_step_ms"] == pytest.approx({"p50": 10.0, "p90": 11.5, "max": 16.0})
    assert spread["step_ms"] == pytest.approx({"p50": 18.0, "p90": 18.0, "max": 18.0})


def test_a_steadier_worker_scores_lower_than_one_with_slow_steps():
    from analysis.breakdown import cluster

    steps = pd.DataFrame(
        {
            "worker": ["a"] * 4 + ["b"] * 4,
            "step": [0, 1, 2, 3] * 2,
            "own_ms": [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 20.0],
            "step_ms": 20.0,
            "end_ns": 0,
        }
    )
    scores = cluster.straggler_scores(steps)
    # b: mean 12.5 against a's 10 (pace 0.8); best 10 against its 90th percentile 17 (steadiness 10/17)
    assert scores["a"] == 0.0 and scores["b"] == pytest.approx(1 - 0.8 * 10 / 17)


def test_text_shows_the_ten_slowest_and_json_and_workers_csv_every_worker(local16, tmp_path):
    text = local16.render("text")
    table = text.split("workers (mean ms per steady step")[1].split("straggler:")[0]
    rows = [line for line in table.splitlines()[2:] if line.strip() and line.split()[0].isdigit()]
    assert len(rows) == 10 and rows[0].split()[0] == "5" and rows[1].split()[0] == "11"
    assert "6 more in workers.csv and the JSON" in text
    assert "without collective wait p50 10.0, p90 11.5, max 16.0" in text
    document = json.loads(local16.render("json"))
    assert len(document["workers"]) == 16 and document["workers"][5]["straggler_score"] == pytest.approx(0.375)
    assert document["worker_distribution"]["own_step_ms"]["max"] == 16.0
    assert [s["worker"] for s in document["slowest_workers"][:2]] == [5, 11]
    local16.write(tmp_path)
    csv = pd.read_csv(tmp_path / "workers.csv")
    assert len(csv) == 16 and csv.loc[csv["worker"] == 11, "straggler_score"].item() == pytest.approx(3 / 13)


def test_the_html_report_draws_a_workers_by_steps_heat_map_with_the_stragglers_marked(local16):
    page = local16.render("html")
    svg = page.split('aria-label="step time without collective wait, per worker and step"')[1].split("</svg>")[0]
    assert svg.count("<rect x=") == 16 * 5  # a cell per worker and step
    assert svg.count('class="marked"') == 2
    assert "straggler 5: host, score 0.38" in svg and "11: input, score 0.23" in svg


class RecordingExecutor(Executor):
    """Runs each task in a thread and keeps what it sent back, pickled as a cluster would send it,
    with the task's arguments."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(2)
        self.sent: list[tuple[tuple, bytes]] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = self.pool.submit(fn, *args, **kwargs)
        future.add_done_callback(lambda f: self.sent.append((args, pickle.dumps(f.result()))))
        return future


def test_any_executor_runs_one_task_per_worker_and_gets_its_summary_only(job16, local16):
    recording = RecordingExecutor()
    result = pipeline.analyze(job16.path, executor=recording)
    assert result.to_json() == local16.to_json()
    assert len(recording.sent) == 16
    summaries = {args[0].name: pickle.loads(blob) for args, blob in recording.sent}
    assert isinstance(summaries.pop("worker-0"), pipeline.Analysis)  # the chief's breakdown is the job's
    assert all(isinstance(s, WorkerSummary) for s in summaries.values())
    trace_bytes = max(p.stat().st_size for p in job16.path.rglob("*.xplane.pb"))
    # a summary is its tables (steps, devices, ops, stages), never the trace's events
    for _, blob in recording.sent:
        assert not any(isinstance(v, pd.DataFrame) and len(v) > 50 for v in vars(pickle.loads(blob)).values())
        assert len(blob) < 40 * trace_bytes


def test_a_worker_other_than_the_first_sends_back_only_the_columns_of_its_steady_steps_the_job_reads(tmp_path):
    steps = 200
    job = write_job(tmp_path, workers=3, slow={}, steps=steps)
    recording = RecordingExecutor()
    result = pipeline.analyze(job.path, executor=recording)
    assert result.to_json() == pipeline.analyze(job.path, processes=1).to_json()
    sent = {args[0].name: blob for args, blob in recording.sent}
    for name in ("worker-1", "worker-2"):
        summary = pickle.loads(sent[name])
        assert list(summary.steady.columns) == [
            "step",
            "step_ms",
            "input_ms",
            "compute_ms",
            "host_ms",
            "collective_ms",
            "end_ns",
        ]
        assert len(summary.steady) == steps
        # 7 eight-byte columns of 200 steps (11,200 bytes), its means and notes: not its whole steps table
        # (21 columns), ops, devices and verdict
        assert len(sent[name]) < 7 * 8 * steps + 8_000


def test_a_cut_or_unreadable_trace_is_named_in_its_row_and_the_rest_analysed(tmp_path):
    job = write_job(tmp_path)
    cut = next((job.path / "worker-3").rglob("*.xplane.pb"))
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    garbage = next((job.path / "worker-0").rglob("*.xplane.pb"))
    garbage.write_bytes(b"\xff" * 100)
    result = pipeline.analyze(job.path, processes=1)
    status = result.workers.set_index("worker")["status"]
    assert status[3].startswith("unreadable: ") and status[0].startswith("unreadable: ")
    assert (status.drop([0, 3]) == "ok").all()
    assert result.straggler is not None
    assert result.straggler["worker"] == 5 and result.straggler["cause"] == "host"
    assert "2 of 16 workers not analysed (unreadable: 0, 3)" in " ".join(result.notes)
    assert result.path.parent.parent.parent.parent.name == "worker-1"  # the first worker analysed gives the breakdown
    recording = RecordingExecutor()  # worker 1's summary is not enough: it is analysed again, in full
    assert pipeline.analyze(job.path, executor=recording).to_json() == result.to_json()
    assert sorted(args[0].name for args, _ in recording.sent).count("worker-1") == 2


def test_a_job_of_1000_workers_with_990_missing_traces(tmp_path):
    job = write_job(tmp_path, workers=30, slow={}, listed=1000, traced=range(10))
    result = pipeline.analyze(job.path, processes=1)
    assert len(result.workers) == 1000
    assert (result.workers["status"] == "ok").sum() == 10
    lines = [n for n in result.notes if "not analysed" in n]
    assert lines == ["990 of 1000 workers not analysed (no trace: 10-29; missing: 30-999); their rows say why"]
    text = result.render("text")
    assert "990 of 1000 workers not analysed (no trace: 10-29; missing: 30-999)" in text
    assert len(text.splitlines()) < 80


def test_scheduler_without_dask_installed_is_one_error_line(job16, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    assert main(["analyze", str(job16.path), "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --scheduler needs Dask") and '".[cluster]"' in err


def test_a_scheduler_that_does_not_answer_is_one_error_line(job16, capsys, monkeypatch):
    monkeypatch.setattr(executors, "SCHEDULER_TIMEOUT_S", 1.0)
    silent = socket.socket()  # accepts connections, never speaks
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        assert main(["analyze", str(job16.path), "--scheduler", address]) == 2
    finally:
        silent.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: no Dask scheduler answers at {address} within 1 s")


# ---------------------------------------------------------------- a real Dask cluster on loopback


@pytest.fixture
def dask_cluster(tmp_path):
    cluster = DaskCluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow  # starts a Dask scheduler and two worker processes
def test_dask_cluster_gives_the_local_pools_output(job16, local16, dask_cluster, capsys):
    assert (
        main(
            [
                "analyze",
                str(job16.path),
                "--scheduler",
                dask_cluster.address,
                "--format",
                "json",
                "--out",
                str(job16.path.parent / "dask-out"),
            ]
        )
        == 0
    )
    remote = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(job16.path), "--format", "json", "--out", str(job16.path.parent / "local-out")]) == 0
    local = json.loads(capsys.readouterr().out)
    assert remote == local
    assert remote["straggler"]["worker"] == 5 and remote["straggler"]["cause"] == "host"
    assert len(remote["workers"]) == 16


class KillAfterFirst(Executor):
    """Passes tasks to `inner`; once the first result is in, kills one Dask worker process."""

    def __init__(self, inner: Executor, victim: subprocess.Popen):
        self.inner, self.victim = inner, victim
        self.killed_with_pending: int | None = None
        self.futures: list[Future] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = self.inner.submit(fn, *args, **kwargs)
        self.futures.append(future)
        if len(self.futures) == 1:
            future.add_done_callback(self._kill)
        return future

    def _kill(self, _future) -> None:
        self.killed_with_pending = sum(not f.done() for f in self.futures)
        os.kill(self.victim.pid, signal.SIGKILL)


@pytest.mark.slow  # starts a Dask scheduler and two worker processes, and kills one mid-job
def test_a_dask_worker_killed_mid_job_still_gives_every_workers_result(tmp_path, dask_cluster):
    job = write_job(tmp_path, steps=400)  # tasks long enough that the kill lands mid-job
    local = pipeline.analyze(job.path, processes=1)
    with executors.dask_executor(dask_cluster.address) as inner:
        killing = KillAfterFirst(inner, dask_cluster.workers[1])
        remote = pipeline.analyze(job.path, executor=killing)
    dask_cluster.workers[1].wait(timeout=30)
    assert dask_cluster.workers[1].returncode == -signal.SIGKILL
    assert killing.killed_with_pending and killing.killed_with_pending > 1
    assert remote.to_json() == local.to_json()
    assert (remote.workers["status"] == "ok").all() and len(remote.workers) == 16
    assert remote.straggler is not None
    assert remote.straggler["worker"] == 5


def test_an_empty_scheduler_address_is_a_usage_error(job16, capsys):
    assert main(["analyze", str(job16.path), "--scheduler", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --scheduler '' is empty: write tcp://HOST:PORT")


def _analyze_command(path, *options: str) -> list[str]:
    return [sys.executable, "-m", "profiler", "analyze", str(path), *options]


@pytest.mark.slow  # runs devprof analyze as its own process, to see what it prints as it exits
def test_a_bad_scheduler_address_is_one_error_line_and_nothing_at_exit(tmp_path):
    # 'foo' and http:// are refused before connecting; tls:// without certificates fails in Dask's client
    addresses = {
        "foo": "error: --scheduler 'foo' is not HOST:PORT",
        "http://127.0.0.1:8787/status": "error: --scheduler 'http://127.0.0.1:8787/status' is a web address",
        f"tls://127.0.0.1:{_free_port()}": "error: cannot connect to a Dask scheduler at tls://",
    }
    env = dict(os.environ, PYTHONPATH=str(REPO))
    runs = {
        address: subprocess.Popen(
            _analyze_command(tmp_path, "--scheduler", address),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for address in addresses
    }
    for address, process in runs.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 2, (address, err)
        assert err.count("\n") == 1 and err.startswith(addresses[address]), (
            address,
            err,
        )  # no Client.__del__ traceback
        assert out == ""


@pytest.mark.slow  # starts a Dask scheduler and two worker processes
def test_the_dask_workers_get_the_jobs_absolute_path_and_a_path_they_cannot_see_is_named(
    tmp_path, dask_cluster, capsys, monkeypatch
):
    job = write_job(tmp_path, workers=3, slow={})
    monkeypatch.chdir(tmp_path)  # the Dask workers run in the repository's folder, not this one
    assert (
        main(["analyze", job.path.name, "--scheduler", dask_cluster.address, "--format", "json", "--out", "out"]) == 0
    )
    remote = json.loads(capsys.readouterr().out)
    assert [w["status"] for w in remote["workers"]] == ["ok"] * 3
    assert remote["source"].startswith(str(job.path.absolute()))
    # A folder only this process sees: its own open descriptor, which the Dask workers do not have.
    descriptor = os.open(job.path, os.O_RDONLY | os.O_DIRECTORY)
    private = 987
    os.dup2(descriptor, private)
    try:
        assert main(["analyze", f"/proc/self/fd/{private}", "--scheduler", dask_cluster.address]) == 2
    finally:
        os.close(private)
        os.close(descriptor)
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: 2 of 2 Dask workers at {dask_cluster.address} cannot see /proc/self/fd/{private} ")
    assert "(NFS, a mounted bucket)" in err


@pytest.mark.slow  # starts a Dask scheduler, one worker and devprof analyze, and kills the worker mid-job
def test_the_last_dask_worker_killed_mid_job_ends_analyze_with_one_error_line(tmp_path):
    import distributed

    job = write_job(tmp_path, steps=400)  # a few seconds of tasks for one Dask worker
    cluster = DaskCluster(tmp_path, workers=1)
    analyze = None
    try:
        analyze = subprocess.Popen(
            _analyze_command(job.path, "--scheduler", cluster.address, "--format", "json"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        assert analyze.stderr is not None
        with distributed.Client(cluster.address, timeout=60) as client:
            deadline = time.monotonic() + 120
            while not any(client.processing().values()):  # the job's first task is on the worker
                assert analyze.poll() is None, f"analyze ended before its tasks ran: {analyze.stderr.read()}"
                assert time.monotonic() < deadline, "analyze sent no task in 120 s"
                time.sleep(0.05)
            os.kill(cluster.workers[0].pid, signal.SIGKILL)
            killed = time.monotonic()
            _, err = analyze.communicate(timeout=120)  # a hang fails here
            after_kill_s = time.monotonic() - killed
    finally:
        if analyze is not None and analyze.poll() is None:
            analyze.kill()
        cluster.close()
    assert analyze.returncode == 1, err
    assert err.count("\n") == 1
    assert err.startswith(
        f"error: the Dask cluster at {cluster.address} lost its last worker, and none came back within 10 s; "
    )
    assert after_kill_s < 30  # 10 s without a worker, then the error: a wide margin for a loaded machine


@pytest.mark.slow  # opens the report in headless Chromium
def test_the_heat_map_opens_in_chromium_without_errors(local16, tmp_path):
    import browser

    page = tmp_path / "report.html"
    page.write_text(local16.render("html"))
    loaded = browser.load(page, boxes=("#workers svg",))
    assert loaded.errors == [] and loaded.requests == []
    assert loaded.boxes["#workers svg"] is not None and loaded.boxes["#workers svg"]["height"] > 100


def test_the_straggler_rule_still_weighs_each_parts_step_to_step_noise(job16, monkeypatch):
    from analysis.rules import straggler

    seen = []
    real = straggler.find_straggler

    def find_straggler(frame, *a):
        seen.append(frame)
        return real(frame, *a)

    monkeypatch.setattr(straggler, "find_straggler", find_straggler)
    pipeline.analyze(job16.path, processes=1)
    assert {"input_noise_ms", "compute_noise_ms", "host_noise_ms"} <= set(seen[0].columns)


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def device_trace(tmp_path_factory):
    return fx.write_synthetic_device_trace(
        tmp_path_factory.mktemp("gpu") / "plugins/profile/s/h.xplane.pb", gpus=2, empty_gpus=0
    )


def independent_session(folder: Path) -> Path:
    """Two host traces in one session that share nothing: no collective, one host twice as slow."""
    session = folder / "plugins" / "profile" / "2030_01_01_00_00_00"
    base: dict[str, Any] = dict(
        gpus=1,
        steps=6,
        h2d_ms=1.5,
        d2d_ms=0.5,
        collective_ms=0.0,
        gap_ms=2.0,
        skew_ms=0.0,
        empty_gpus=0,
        custom_plane=False,
    )
    fx.write_synthetic_device_trace(session / "hostA.xplane.pb", kernel_ms=6.0, hostname="hostA", **base)
    fx.write_synthetic_device_trace(session / "hostB.xplane.pb", kernel_ms=14.0, hostname="hostB", **base)
    return folder


# ---------------------------------------------------------------- workers and the straggler: hosts that share no collective, one worker, noise, few steps


def test_hosts_without_a_shared_collective_have_no_straggler(tmp_path, capsys):
    logdir = independent_session(tmp_path / "logs")
    result = pipeline.analyze(logdir)
    assert len(result.workers) == 2
    assert result.straggler is None and result.straggler_reason is not None
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
    mean = {
        "step_ms": own_ms + collective_ms,
        "input_ms": 1.0,
        "compute_ms": own_ms - 2.0,
        "host_ms": 1.0,
        "collective_ms": collective_ms,
    }
    if part != "compute":
        mean["compute_ms"] = 10.0
        mean[f"{part}_ms"] = own_ms - 11.0
    result = workers.worker_row(worker, f"node-{worker}", mean, None, cpu)
    result.update(steps_used=steps, own_noise_ms=noise, **{f"{p}_noise_ms": noise for p in workers.CAUSES})
    return result


def test_a_straggler_must_stand_out_of_the_step_to_step_noise():
    quiet = [row(0, 100.0, 20.0), row(1, 115.0)]
    straggler, reason = straggler_rule.find_straggler(pd.DataFrame(quiet))
    assert straggler is not None
    assert straggler["worker"] == 1 and reason is None
    noisy = [row(0, 100.0, 20.0, noise=30.0), row(1, 115.0, noise=30.0)]  # 15 % above, noise 30 ms
    straggler, reason = straggler_rule.find_straggler(pd.DataFrame(noisy))
    assert straggler is None and reason is not None
    assert "no worker stands out" in reason and "noise (30.0 ms)" in reason and "15 %" in reason
    injected = [row(0, 100.0, 42.0, noise=30.0), row(1, 140.0, part="host", noise=30.0)]  # 40 ms of host work
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(injected))
    assert straggler is not None
    assert straggler["worker"] == 1 and straggler["cause"] == "host"


def test_a_worker_slowed_by_other_processes_is_a_contention_straggler():
    busy = [row(0, 100.0, 40.0, cpu=160.0), row(1, 140.0, cpu=110.0)]
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(busy), other_cpu_pct=45.0)
    assert straggler is not None
    assert straggler["worker"] == 1 and straggler["cause"] == "contention"
    assert "45 %" in straggler["evidence"] and "110 % CPU" in straggler["evidence"]
    # Host work that keeps its process busy is its own cause, also on a busy machine.
    host_work = [row(0, 100.0, 40.0, cpu=110.0), row(1, 140.0, part="host", cpu=160.0)]
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(host_work), other_cpu_pct=45.0)
    assert straggler is not None
    assert straggler["cause"] == "host"
    # A quiet machine: less CPU is not contention.
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(busy), other_cpu_pct=2.0)
    assert straggler is not None
    assert straggler["cause"] == "compute"
    # A worker waiting 40 ms a step for its data uses less CPU on a busy machine too: its compute is
    # the others', so the cause is its input (a two-worker job with injected input read contention).
    waiting = [row(0, 100.0, 40.0, part="input", cpu=160.0), row(1, 140.0, part="input", cpu=110.0)]
    straggler, _ = straggler_rule.find_straggler(pd.DataFrame(waiting), other_cpu_pct=45.0)
    assert straggler is not None
    assert straggler["worker"] == 1 and straggler["cause"] == "input", straggler
    # ... unless its compute, which needs the CPU, is slow as well: then it was starved.
    starved = pd.DataFrame(waiting)
    starved.loc[1, "compute_ms"] += 20.0
    starved.loc[1, "step_ms"] += 20.0
    straggler, _ = straggler_rule.find_straggler(starved, other_cpu_pct=45.0)
    assert straggler is not None
    assert straggler["worker"] == 1 and straggler["cause"] == "contention", straggler


def test_too_few_steps_to_tell_is_said_plainly():
    straggler, reason = straggler_rule.find_straggler(
        pd.DataFrame([row(0, 100.0, 40.0, steps=2), row(1, 140.0, steps=2)])
    )
    assert straggler is None and reason is not None
    assert "too few steps to tell" in reason and "--profile-steps" in reason


def test_a_session_with_few_steps_says_so(tmp_path):
    session = fx.write_synthetic_session(tmp_path / "s", workers=2, slow_worker=1, slow_part="host", steps=2)
    result = pipeline.analyze(session.logdir)
    assert result.straggler is None and result.straggler_reason is not None
    assert "too few steps" in result.straggler_reason
    assert "straggler: none (too few steps" in result.render("text")
