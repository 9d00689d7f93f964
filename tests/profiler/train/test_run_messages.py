"""A run says what it does: the test pass names the images it evaluates, run.json's
`config.validation_images` is the number validated (beside `data.val_images`), and notices go to
stderr. One real tiny run; the others resolve a fake CPU and need no TensorFlow."""

from __future__ import annotations

import json

import pytest

from fake_backend import _fake_cpu_run
from profiler import cli
from profiler.device import devices
from profiler.record.console import Console
from profiler.train.config import RunConfig


@pytest.mark.slow
def test_a_run_on_fewer_test_images_says_so(tmp_path, capsys):
    code = cli.main(
        [
            "run",
            "--device",
            "cpu",
            "--data",
            "synthetic",
            "--limit-images",
            "100",
            "--limit-test-images",
            "100",
            "--epochs",
            "1",
            "--batch-size",
            "50",
            "--no-profile",
            "--no-sample",
            "--out",
            str(tmp_path),
            "--run-name",
            "r",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Evaluating on the first 100 test images (--limit-test-images)..." in captured.out.splitlines()
    assert "whole test set" not in captured.out
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["config"]["validation_images"] == 100 == meta["data"]["val_images"]
    assert meta["config"]["limit_test_images"] == 100 and meta["test"]["images"] == 100


# ---------------------------------------------------------------- notices go to stderr


def test_notices_go_to_stderr(tmp_path, capsys, monkeypatch):
    from models import data as data_mod

    monkeypatch.setattr(data_mod, "keras_cache_dir", lambda: tmp_path / "no-keras-home")
    run = _fake_cpu_run(tmp_path, monkeypatch, data="auto")
    run.prepare()
    captured = capsys.readouterr()
    assert captured.err.startswith("notice: CIFAR-10 not found locally"), captured.err
    assert run.console.stream.getvalue() == "" and captured.out == ""
    quiet_run = _fake_cpu_run(tmp_path, monkeypatch, data="auto", quiet=True)
    quiet_run.console = Console(True)
    quiet_run.prepare()
    assert capsys.readouterr().err == ""  # --quiet: no notices either


def test_the_samplers_notice_goes_to_stderr(tmp_path, capsys, monkeypatch):
    from profiler import samplers

    class Group:
        def start(self):
            return None

        def status(self):
            return {"gpu": {"ran": False, "reason": "no GPU sampler: NVML not found"}}

    monkeypatch.setattr(samplers, "build_sampler_group", lambda *a, **k: Group())
    run = _fake_cpu_run(tmp_path, monkeypatch, sample=True)
    run.meta, run.path = {}, tmp_path / "r"
    run._start_samplers(devices.Resolved("cpu", None, {}))
    assert capsys.readouterr().err == "notice: no GPU sampler: NVML not found\n"
    assert run.console.stream.getvalue() == ""


# ---------------------------------------------------------------- what the test pass does


def test_the_test_pass_says_how_many_images_it_evaluates():
    from profiler.train.run import evaluation_message

    assert evaluation_message(100, 100) == "Evaluating on the first 100 test images (--limit-test-images)..."
    assert evaluation_message(10_000, None) == "Evaluating on the whole test set (10,000 images)..."
    assert evaluation_message(10_000, 50_000) == "Evaluating on the whole test set (10,000 images)..."


def test_run_json_config_records_the_images_validated(tmp_path, monkeypatch):
    from profiler.record import session as session_mod

    monkeypatch.setattr(session_mod, "versions", lambda: {})
    run = _fake_cpu_run(tmp_path, monkeypatch, limit_test_images=200)
    resolved, arrays = run.prepare()
    meta = run._initial_meta(resolved, arrays)
    assert meta["config"]["validation_images"] == 200 == meta["data"]["val_images"]
    assert meta["config"]["limit_test_images"] == 200
    whole = _fake_cpu_run(tmp_path, monkeypatch, limit_test_images=None, run_name="w")
    resolved, arrays = whole.prepare()
    assert whole._initial_meta(resolved, arrays)["config"]["validation_images"] == 1000


def test_the_job_run_json_records_the_images_validated():
    from profiler.device import cluster as cluster_mod
    from profiler.record import job

    stand_in = cluster_mod.Cluster(
        ("127.0.0.1:1", "127.0.0.1:2"), 0, "--workers", cluster_mod.local_tf_config([1, 2], 0)
    )
    meta = job.new_meta(RunConfig(limit_test_images=200, cluster=stand_in), list(stand_in.workers), "id")
    assert meta["config"]["validation_images"] == 200
    assert job.new_meta(RunConfig(), ["a"], "id")["config"]["validation_images"] == 1000
