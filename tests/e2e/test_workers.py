"""Several workers: `devprof run --workers N` (real worker processes on 127.0.0.1 with
MultiWorkerMirroredStrategy), the cluster options, `MS@WORKER` injections, a worker killed
mid-epoch, Ctrl-C on the job, and a capture of every worker into one session."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import analysis
import trace_fixtures as fx
from analysis.read import run_csvs, run_files
from job_fixtures import write_job
from profiler import cli
from profiler.device import cluster as cluster_mod
from profiler.train.config import RunConfig, UsageError
from repo_paths import REPO

# Tiny jobs: 400 images in global batches of 20 (10 per worker) are 20 steps an epoch; the
# steps traced are 4..19, and validation and test use 200 images.
TINY = [
    "--device",
    "cpu",
    "--data",
    "synthetic",
    "--limit-images",
    "400",
    "--limit-test-images",
    "200",
    "--batch-size",
    "20",
    "--sample-interval",
    "0.2",
]
INJECTED_MS = 40.0


def devprof(*args: str | Path, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(cluster_mod.TF_CONFIG, None)
    return subprocess.Popen(
        [sys.executable, "-m", "profiler", *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run_job(out: Path, name: str, *args: str) -> tuple[Path, str, str]:
    proc = devprof(
        "run",
        "--workers",
        "2",
        *TINY,
        "--epochs",
        "1",
        "--profile-steps",
        "4:20",
        "--out",
        out,
        "--run-name",
        name,
        *args,
    )
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, (stdout, stderr)
    return out / name, stdout, stderr


def analyze_json(job: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["analyze", str(job), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def wait_for_steps(csv: Path, rows: int, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        assert proc.poll() is None, proc.communicate()
        try:
            if len(csv.read_text().splitlines()) > rows:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{csv} did not reach {rows} rows in {timeout} s")


# ---------------------------------------------------------------- a job of two workers


@pytest.fixture(scope="module")
def host_straggler_job(tmp_path_factory):
    """Worker 1 does 40 ms of extra Python work per step; worker 0 waits for it."""
    return run_job(tmp_path_factory.mktemp("workers"), "host1", "--inject-host-delay-ms", f"{INJECTED_MS:g}@1")


@pytest.mark.slow
def test_two_workers_write_a_job_of_two_complete_run_directories(host_straggler_job):
    job, stdout, stderr = host_straggler_job
    meta = read_json(job / "run.json")
    assert meta["status"] == "complete" and meta["error"] is None
    assert meta["workers"] == ["worker-0", "worker-1"] and meta["num_workers"] == 2
    assert meta["global_batch_size"] == 20 and meta["per_worker_batch_size"] == 10
    assert meta["strategy"] == "MultiWorkerMirroredStrategy"
    assert {w: s["status"] for w, s in meta["worker_status"].items()} == {
        "worker-0": "complete",
        "worker-1": "complete",
    }
    assert meta["launcher"]["exit_codes"] == {"worker-0": 0, "worker-1": 0}
    assert run_files.worker_dirs(job) == [job / "worker-0", job / "worker-1"]
    for index in (0, 1):
        worker = job / f"worker-{index}"
        wmeta = read_json(worker / "run.json")
        assert wmeta["status"] == "complete"
        assert wmeta["worker"]["index"] == index and wmeta["worker"]["num_workers"] == 2
        assert wmeta["device"]["strategy"] == "MultiWorkerMirroredStrategy"
        assert wmeta["device"]["intra_op_threads"] == max(1, (os.cpu_count() or 1) // 2)
        assert wmeta["injected"] == {"input_delay_ms": 0.0, "host_delay_ms": INJECTED_MS if index == 1 else 0.0}
        steps = run_csvs.read_steps_csv(worker / "steps.csv")
        assert list(steps["step"]) == list(range(20)) and (steps["images"] == 20).all()  # the job's global batch
        assert list(worker.glob("plugins/profile/*/*.xplane.pb")), f"no trace in {worker}"
        assert wmeta["profiler"]["first_step"] == 4 and wmeta["profiler"]["last_step"] == 19
        assert (worker / "utilization" / "host.csv").is_file()
        assert wmeta["epochs"][0]["images"] == 400
    # One job, one progress: the chief's epoch line once, no worker output on the console.
    # (a pipe gets a progress line "Epoch 1/1 - step k/20" every 30 s of a slow epoch as well)
    lines = stdout.splitlines()
    assert lines.count("Epoch 1/1") == 1 and stdout.count("20/20 - ") == 1, stdout
    assert all(
        re.fullmatch(r"Epoch 1/1 - step (1?[0-9])/20", line) for line in lines if line.startswith("Epoch 1/1 - ")
    ), stdout
    assert stdout.strip().splitlines()[-1] == f"run directory: {job}"
    assert "Traceback" not in stdout + stderr and "error" not in stderr, stderr


@pytest.mark.slow
def test_analysis_names_the_worker_with_host_work_as_the_straggler(host_straggler_job, capsys):
    job = host_straggler_job[0]
    result = analyze_json(job, capsys)
    rows = {row["worker"]: row for row in result["workers"]}
    assert sorted(rows) == [0, 1]
    assert result["straggler"]["worker"] == 1 and result["straggler"]["cause"] == "host", result["straggler"]
    # Ground truth: the 40 ms are worker 1's host time, and worker 0 spends them waiting in the all-reduce.
    assert rows[1]["host_ms"] >= 0.8 * INJECTED_MS and rows[0]["host_ms"] < INJECTED_MS / 2, (
        rows
    )  # a hog beside it shifts a little of the spin
    assert rows[0]["collective_ms"] > rows[1]["collective_ms"] + INJECTED_MS / 4, rows
    # Every worker's memory, named by worker: each one's allocators as that worker's own analysis reads them.
    memory = result["memory"]["workers"]
    assert [w["worker"] for w in memory] == [0, 1]
    for entry in memory:
        own = analysis.analyze(job / f"worker-{entry['worker']}").memory
        assert own is not None and own.allocators, f"worker {entry['worker']} traced no allocator"
        assert {a["name"]: a["peak_bytes"] for a in entry["allocators"]} == {
            a.name: a.peak_bytes for a in own.allocators
        }


@pytest.mark.slow
def test_analysis_names_the_worker_with_slow_input_as_the_straggler(tmp_path, capsys):
    job, _, _ = run_job(tmp_path, "input0", "--inject-input-delay-ms", f"{INJECTED_MS:g}@0")
    assert read_json(job / "worker-0" / "run.json")["injected"]["input_delay_ms"] == INJECTED_MS
    assert read_json(job / "worker-1" / "run.json")["injected"]["input_delay_ms"] == 0.0
    result = analyze_json(job, capsys)
    rows = {row["worker"]: row for row in result["workers"]}
    assert result["straggler"]["worker"] == 0 and result["straggler"]["cause"] == "input", result["straggler"]
    assert rows[0]["input_ms"] >= INJECTED_MS - 2 and rows[1]["input_ms"] < INJECTED_MS / 2, rows
    assert rows[1]["collective_ms"] > rows[0]["collective_ms"] + INJECTED_MS / 4, rows


# ---------------------------------------------------------------- faults


def long_job(out: Path, name: str, *args: str) -> subprocess.Popen:
    return devprof(
        "run", "--workers", "2", *TINY, "--epochs", "40", "--no-profile", "--out", out, "--run-name", name, *args
    )


@pytest.mark.slow
def test_a_killed_worker_stops_the_job_and_every_run_directory_says_how_it_ended(tmp_path):
    proc = long_job(tmp_path, "killed")
    job = tmp_path / "killed"
    wait_for_steps(job / "worker-0" / "steps.csv", 25, proc)  # in the second epoch
    victim = read_json(job / "run.json")["launcher"]["pids"]["worker-1"]
    os.kill(victim, signal.SIGKILL)
    recorded = len(run_csvs.read_steps_csv(job / "worker-0" / "steps.csv"))
    killed_at = time.monotonic()
    stdout, stderr = proc.communicate(timeout=300)
    took = time.monotonic() - killed_at
    assert proc.returncode == 1, (stdout, stderr)
    assert took < 60, f"the job took {took:.0f} s to stop"
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert errors[0].startswith("error: worker 1 failed: killed by signal 9 (SIGKILL)"), errors
    assert "Traceback" not in stderr
    meta = read_json(job / "run.json")
    assert meta["status"] == "failed" and meta["failed_worker"] == "worker-1"
    assert meta["error"].startswith("worker-1: killed by signal 9")
    killed = read_json(job / "worker-1" / "run.json")
    assert killed["status"] == "failed" and killed["error"] == "killed by signal 9"
    survivor = read_json(job / "worker-0" / "run.json")
    assert survivor["status"] in ("failed", "interrupted"), survivor["status"]
    assert "worker-1 failed" in survivor["stopped_by_launcher"]
    for index in (0, 1):  # the completed steps stay readable
        steps = run_csvs.read_steps_csv(job / f"worker-{index}" / "steps.csv")
        # A step's row is written when the next step begins: a worker killed between the two
        # loses the row of the step it had just finished, and no other.
        assert len(steps) >= recorded - 1 and list(steps["step"]) == list(range(len(steps)))


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_cleanly(tmp_path):
    proc = long_job(tmp_path, "stopped")
    job = tmp_path / "stopped"
    wait_for_steps(job / "worker-1" / "steps.csv", 5, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted: job" in stderr and "Traceback" not in stderr, stderr
    assert read_json(job / "run.json")["status"] == "interrupted"
    for index in (0, 1):
        meta = read_json(job / f"worker-{index}" / "run.json")
        assert meta["status"] == "interrupted" and meta["interrupted_by"] in ("SIGINT", "SIGKILL"), meta["status"]
        assert len(run_csvs.read_steps_csv(job / f"worker-{index}" / "steps.csv")) >= 5


@pytest.mark.slow
def test_capture_takes_every_worker_into_one_session(tmp_path):
    from profiler.record import tracing

    port = cluster_mod.free_ports(1)[0]
    while any(_busy(p) for p in (port, port + 1)):
        port = cluster_mod.free_ports(1)[0]
    # Epochs to spare: on a loaded machine the two captures' own starts take tens of seconds, and a job
    # that ended under them would close the profiler servers mid-capture. It is stopped below.
    proc = long_job(tmp_path, "captured", "--profiler-port", str(port), "--epochs", "1000")
    try:
        wait_for_steps(tmp_path / "captured" / "worker-1" / "steps.csv", 3, proc)
        targets = f"grpc://127.0.0.1:{port},grpc://127.0.0.1:{port + 1}"
        for attempt, duration_ms in enumerate((1500, 4000)):
            out = tmp_path / f"captures-{attempt}"
            capture = devprof("capture", targets, "--duration-ms", str(duration_ms), "--out", out)
            stdout, stderr = capture.communicate(timeout=300)
            assert capture.returncode == 0, (stdout, stderr)
            newest = tracing.newest_xplane(out)
            assert newest is not None
            names = sorted(p.name for p in newest.parent.glob("*.xplane.pb"))
            if len(names) == 2:
                break
            # A worker blocked for the whole window (a loaded machine) records nothing: the
            # command must say which, and a longer window must take it.
            assert "(expected one per host: 2)" in stdout and "warning: no trace from grpc://127.0.0.1:" in stderr
        assert names == [f"127.0.0.1_{port}.xplane.pb", f"127.0.0.1_{port + 1}.xplane.pb"]
        assert "traces written: 2" in stdout and "warning" not in stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=90)
    meta = read_json(tmp_path / "captured" / "run.json")
    assert meta["launcher"]["profiler_ports"] == [port, port + 1]


def _busy(port: int) -> bool:
    from profiler.record import tracing

    try:
        tracing.check_port_free(port)
        return False
    except OSError:
        return True


# ---------------------------------------------------------------- options (no TensorFlow, no processes)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("30", (30.0, None)),
        ("30@1", (30.0, 1)),
        ("2.5@0", (2.5, 0)),
        (" 0 ", (0.0, None)),
        ("nan", None),
    ],
)
def test_injection_is_milliseconds_for_one_worker_or_all(text, expected):
    injection = cluster_mod.parse_injection(text)
    if expected is None:
        assert injection.ms != injection.ms and injection.worker is None  # NaN: refused later, as a float option
    else:
        assert tuple(injection) == expected
    assert cluster_mod.Injection(30.0, 1).for_worker(1) == 30.0 and cluster_mod.Injection(30.0, 1).for_worker(0) == 0
    assert cluster_mod.Injection(30.0).for_worker(None) == 30.0 and str(cluster_mod.Injection(30.0, 1)) == "30@1"


@pytest.mark.parametrize("text", ["30@x", "x", "30@", "30@-1", "30@1@2", ""])
def test_injection_that_does_not_parse(text, capsys):
    with pytest.raises(ValueError):
        cluster_mod.parse_injection(text)
    assert cli.main(["run", "--inject-host-delay-ms", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: argument --inject-host-delay-ms: "), err


def two_workers(index: int = 0) -> cluster_mod.Cluster:
    return cluster_mod.from_option("127.0.0.1:2001,127.0.0.1:2002", index)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"inject_host_worker": 2}, "--inject-host-delay-ms 30@2: there is no worker 2; the job has 2 workers (0..1)"),
        ({"inject_input_worker": 5}, "--inject-input-delay-ms 30@5: there is no worker 5"),
    ],
)
def test_injection_names_a_worker_of_the_job(kwargs, message):
    config = RunConfig(run_name="job", cluster=two_workers(), **kwargs)
    config.train.inject_host_delay_ms = config.train.inject_input_delay_ms = 30.0
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        config.validate()


def test_injection_for_one_worker_needs_several(tmp_path, capsys):
    out = tmp_path / "runs"
    assert cli.main(["run", *TINY, "--quiet", "--out", str(out), "--inject-input-delay-ms", "30@1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --inject-input-delay-ms 30@1 names worker 1, but this run has one worker"), err
    assert not out.exists()


@pytest.mark.parametrize("value", ["nan", "inf@1", "-5@0"])
def test_injection_milliseconds_are_a_finite_number(value):
    injection = cluster_mod.parse_injection(value)
    config = RunConfig(run_name="job", cluster=two_workers(), inject_host_worker=injection.worker)
    config.train.inject_host_delay_ms = injection.ms
    with pytest.raises(UsageError, match="^--inject-host-delay-ms must be"):
        config.validate()


def test_tf_config_gives_the_workers_and_this_one():
    config = {"cluster": {"worker": ["h1:2222", "h2:2222", "[::1]:2223"]}, "task": {"type": "worker", "index": 2}}
    cluster = cluster_mod.from_tf_config(json.dumps(config))
    assert cluster.workers == ("h1:2222", "h2:2222", "[::1]:2223") and cluster.index == 2
    assert cluster.name == "worker-2" and not cluster.is_chief and cluster.source == "TF_CONFIG"
    chief = {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}}
    assert cluster_mod.from_tf_config(json.dumps(chief)).index == 1  # the chief is worker 0
    chief["task"] = {"type": "chief", "index": 0}
    assert cluster_mod.from_tf_config(json.dumps(chief)).is_chief


@pytest.mark.parametrize(
    "config, message",
    [
        ("not json", "TF_CONFIG is not valid JSON"),
        ({"task": {"type": "worker", "index": 0}}, 'TF_CONFIG needs a "cluster" object'),
        ({"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, "task": {"type": "worker", "index": 0}}, "'ps' tasks"),
        (
            {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}},
            "task index 2 is out of range",
        ),
        ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}, "lists a:1 twice"),
        ({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}, "'a' is not HOST:PORT"),
        ({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}}, "port must be from 1 to 65535"),
        ({"cluster": {"worker": ["a:1"]}}, 'TF_CONFIG needs a "task"'),
        ({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}, "lists no workers"),
    ],
)
def test_tf_config_that_cannot_work(config, message):
    with pytest.raises(cluster_mod.ClusterError, match=message.replace("(", r"\(").replace("[", r"\[")):
        cluster_mod.from_tf_config(config if isinstance(config, str) else json.dumps(config))


def test_cluster_option_builds_tf_config():
    cluster = cluster_mod.resolve("h1:2222, h2:2222", 1, environ={})
    assert cluster is not None
    assert cluster.workers == ("h1:2222", "h2:2222") and cluster.index == 1 and cluster.source == "--cluster"
    assert json.loads(cluster.tf_config) == {
        "cluster": {"worker": ["h1:2222", "h2:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert cluster_mod.resolve(None, None, environ={}) is None
    from_env = cluster_mod.resolve(None, 1, environ={"TF_CONFIG": cluster.tf_config})
    assert from_env is not None
    assert from_env.index == 1 and from_env.source == "TF_CONFIG"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cluster", "h1:2222,h2:2222"], "--cluster needs --task-index"),
        (["--cluster", "h1:2222,h2:2222", "--task-index", "2"], "--task-index: task index 2 is out of range"),
        (["--cluster", "h1:2222,,h2:2222", "--task-index", "0"], "an empty worker address"),
        (["--cluster", "h1,h2:2222", "--task-index", "0"], "worker address 'h1' is not HOST:PORT"),
        (["--task-index", "0"], "--task-index needs --cluster (or TF_CONFIG in the environment)"),
        (["--cluster", "h1:2222,h2:2222", "--task-index", "0"], "--run-name is required with --cluster"),
        (["--workers", "2", "--cluster", "h1:1,h2:1"], "--workers starts a job on this machine"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--workers", "2", "--device", "gpu"], "--workers starts CPU workers on this machine"),
        (
            ["--workers", "3", "--oversubscribe", "--run-name", "j"],
            "--batch-size 20 is the global batch and must split evenly among 3 workers (e.g. 18 or 21)",
        ),
        (["--workers", "2", "--run-name", "j", "--inject-host-delay-ms", "30@2"], "there is no worker 2"),
    ],
)
def test_cluster_options_that_cannot_work_are_usage_errors(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.delenv(cluster_mod.TF_CONFIG, raising=False)
    out = tmp_path / "runs"
    assert cli.main(["run", *TINY, "--quiet", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


def test_tf_config_needs_a_run_name_and_agrees_with_task_index(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(cluster_mod.TF_CONFIG, cluster_mod.local_tf_config([2001, 2002], 1))
    out = tmp_path / "runs"
    assert cli.main(["run", *TINY, "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "error: --run-name is required with TF_CONFIG: every worker writes its worker-<i>/ "
        "folder into the same <out>/<run-name>/ job folder"
    ), err
    assert cli.main(["run", *TINY, "--quiet", "--out", str(out), "--run-name", "j", "--task-index", "0"]) == 2
    assert "--task-index 0 disagrees with TF_CONFIG, which makes this host worker 1" in capsys.readouterr().err
    assert cli.main(["run", "--workers", "2", *TINY, "--quiet", "--out", str(out)]) == 2
    assert "TF_CONFIG is set in the environment" in capsys.readouterr().err
    assert not out.exists()


def test_a_job_folder_is_never_overwritten(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cluster_mod.TF_CONFIG, raising=False)
    (tmp_path / "runs" / "job").mkdir(parents=True)
    assert (
        cli.main(["run", "--workers", "2", *TINY, "--quiet", "--out", str(tmp_path / "runs"), "--run-name", "job"]) == 2
    )
    assert "already exists; runs are never overwritten" in capsys.readouterr().err
    from profiler.record import job, rundir

    rundir.write_json_atomic(tmp_path / "runs" / "job" / "run.json", {"job_id": "another"})
    with pytest.raises(rundir.RunExistsError):
        job.check_free(tmp_path / "runs" / "job", "mine")
    job.check_free(tmp_path / "runs" / "job", "another")  # its own launcher's run.json


def test_workers_pass_on_every_option_the_launcher_was_given():
    from profiler.cli.commands import run as run_command
    from profiler.cli.launcher import child_options

    parser = cli.build_parser()
    given = [
        "run",
        "--workers",
        "2",
        "--device",
        "cpu",
        "--data",
        "synthetic",
        "--epochs",
        "3",
        "--batch-size",
        "64",
        "--inject-input-delay-ms",
        "12.5@1",
        "--inject-host-delay-ms",
        "3",
        "--no-profile",
        "--python-tracer",
        "--sample-interval",
        "0.1",
        "--collective-timeout-s",
        "30",
        "--seed",
        "7",
        "--jit-compile",
        "--out",
        "elsewhere",
        "--run-name",
        "j",
        "--profiler-port",
        "7000",
        "--quiet",
    ]
    args = parser.parse_args(given)
    child = parser.parse_args(["run", *child_options(args, run_command.OPTIONS)])
    for option in (
        "device",
        "data",
        "epochs",
        "batch_size",
        "inject_input_delay_ms",
        "inject_host_delay_ms",
        "profile",
        "python_tracer",
        "sample_interval",
        "collective_timeout_s",
        "seed",
        "jit_compile",
    ):
        assert getattr(child, option) == getattr(args, option), option
    assert child.workers is None and child.profiler_port is None and child.run_name is None  # set per worker
    auto = parser.parse_args(["run", "--workers", "2"])
    assert parser.parse_args(["run", *child_options(auto, run_command.OPTIONS)]).device == "cpu"


def test_the_workers_command_line_is_the_given_options_in_the_tables_order():
    from profiler.cli.commands import run as run_command
    from profiler.cli.launcher import child_options

    parser = cli.build_parser()
    args = parser.parse_args(
        [
            "run",
            "--workers",
            "2",
            "--quiet",
            "--python-tracer",
            "--epochs",
            "3",
            "--no-profile",
            "--collective-timeout-s",
            "30",
            "--inject-input-delay-ms",
            "12.5@1",
            "--out",
            "x",
        ]
    )
    assert child_options(args, run_command.OPTIONS) == [
        "--epochs",
        "3",
        "--inject-input-delay-ms",
        "12.5@1",
        "--collective-timeout-s",
        "30.0",
        "--no-profile",
        "--python-tracer",
        "--device",
        "cpu",
    ]


def test_every_run_option_is_in_the_table_the_launcher_reads():
    from profiler.cli.commands import run as run_command

    given = {
        dest: value
        for dest, value in vars(cli.build_parser().parse_args(["run"])).items()
        if dest not in ("command", "handler")
    }
    assert {option.dest: option.default for option in run_command.OPTIONS} == given


def test_each_local_worker_gets_its_share_of_the_cores():
    assert cluster_mod.thread_counts(1, cores=16) is None  # alone on its machine: TensorFlow's defaults
    assert cluster_mod.thread_counts(2, cores=2) == (1, 1)
    assert cluster_mod.thread_counts(4, cores=16) == (4, 2)
    assert cluster_mod.thread_counts(8, cores=4) == (1, 1)
    assert two_workers().local_workers() == 2
    assert cluster_mod.from_option("192.0.2.1:1,192.0.2.2:1", 0).local_workers() == 1


def test_capture_addresses():
    from profiler.record import tracing

    assert tracing.parse_service_addresses("grpc://h1:1,grpc://h2:2") == ["grpc://h1:1", "grpc://h2:2"]
    assert tracing.parse_service_addresses("grpc://[::1]:9012, grpc://10.0.0.2:1") == [
        "grpc://[::1]:9012",
        "grpc://10.0.0.2:1",
    ]
    for bad in (
        "h1:1",
        "grpc://h1:1,h2:2",
        "grpc://h1",
        "grpc://h1:1,grpc://h1:1",
        "grpc://h1:1,",
        "grpc://[::1:9012",
        "grpc://::1:9012",
        "grpc://h 1:1",
        "grpc://h1/x:1",
        "grpc://:1",
    ):
        with pytest.raises(ValueError):
            tracing.parse_service_addresses(bad)


# ---------------------------------------------------------------- every format states the same step sum


PARTS = ("input", "compute", "collective", "host")


def _parts_of(split: str) -> dict[str, float]:
    """{"input": 1.5, ...} from a sentence such as "input 1.50 (8.3 %) + compute 6.00 ms (33.3 %) + ..."."""
    return {part: float(value) for part, value in re.findall(r"\b(input|compute|collective|host) ([0-9.]+)", split)}


def _text_sum(text: str) -> dict[str, float]:
    line = next(line for line in text.splitlines() if line.startswith("mean over "))
    found = re.search(r": step ([0-9.]+) ms = (.*)$", line)
    assert found is not None, line
    step, split = found.groups()
    return {"step": float(step), **_parts_of(split)}


def _html_sum(page: str) -> dict[str, float]:
    found = re.search(r"steady steps: ([0-9.]+) ms = ([^<]*)\.", page)
    assert found is not None
    step, split = found.groups()
    return {"step": float(step), **_parts_of(split)}


def _markdown_sum(page: str) -> dict[str, float]:
    lines = page.split("## Mean step", 1)[1].strip().splitlines()
    header, row = ([cell.strip() for cell in line.strip("|").split("|")] for line in (lines[0], lines[2]))
    values = dict(zip(header, map(float, row)))
    return {"step": values["step_ms"], **{part: values[f"{part}_ms"] for part in PARTS if f"{part}_ms" in values}}


def _json_sum(document: str) -> dict[str, float]:
    mean = json.loads(document)["mean"]
    return {"step": mean["step_ms"], **{part: mean[f"{part}_ms"] for part in PARTS}}


def _steps_rows(text: str) -> pd.DataFrame:
    """The steps table printed by text or Markdown (columns step, steps, step_ms, ...), as numbers."""
    lines = text.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.replace("|", " ").split()[:3] == ["step", "steps", "step_ms"]
    )
    block = lines[start : lines.index("", start)]
    if block[0].startswith("|"):
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in block]
        return pd.DataFrame(rows[2:], columns=rows[0]).astype(float)
    rows = [line.split() for line in block]
    return pd.DataFrame(rows[1:], columns=rows[0]).astype(float)


@pytest.mark.parametrize("kind", ["job", "session"])
def test_every_format_states_the_same_step_sum_with_the_collective_wait(tmp_path, kind):
    """Worker 0 waits 8 ms per step in the all-reduce for worker 1's 6 ms of extra host work:
    every format says 18 = input 1.5 + compute 6 + collective 8 + host 2.5, which adds up."""
    if kind == "job":
        job = write_job(tmp_path)
        path, collective, host = job.path, job.collective_ms[0], job.host_ms[0]
    else:
        session = fx.write_synthetic_session(tmp_path, workers=2, slow_worker=1, slow_part="host", extra_ms=6.0)
        path, collective, host = session.logdir, session.collective_ms[0], 18.0 - 1.5 - 6.0 - session.collective_ms[0]
    assert collective == 8.0 and host == 2.5
    expected = {"step": 18.0, "input": 1.5, "compute": 6.0, "collective": collective, "host": host}
    result = analysis.analyze(path)
    sums = {
        "text": _text_sum(result.render("text")),
        "markdown": _markdown_sum(result.render("markdown")),
        "json": _json_sum(result.render("json")),
        "html": _html_sum(result.render("html")),
    }
    for fmt, parts in sums.items():
        assert parts == pytest.approx(expected, abs=0.006), (fmt, parts)
        assert sum(parts[p] for p in PARTS) == pytest.approx(parts["step"], abs=0.02), fmt
    # and each step row of the text and Markdown tables adds up to its step
    for fmt in ("text", "markdown"):
        rows = _steps_rows(result.render(fmt))
        assert (rows["collective_ms"] == collective).all(), fmt
        assert (rows[[f"{p}_ms" for p in PARTS]].sum(axis=1) - rows["step_ms"]).abs().max() < 1e-6, fmt
