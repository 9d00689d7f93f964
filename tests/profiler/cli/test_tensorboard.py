"""`devprof tensorboard`: a real TensorBoard on 127.0.0.1, queried over HTTP like the browser does.

Endpoints (TensorBoard 2.21 with the XProf 2.24 profile plugin; the plugin gzips its answers):
  /data/plugin/profile/runs                       -> ["<run>/<session>", ...]
  /data/plugin/profile/run_tools?run=R            -> ["overview_page", "trace_viewer@", ...]
  /data/plugin/profile/hosts?run=R&tag=TOOL       -> [{"hostname": ...}]
  /data/plugin/profile/data?run=R&tag=TOOL&host=H -> the tool's data (DataTable JSON)
  /data/plugin/scalars/tags                       -> {"<run>": {"step/loss": {...}, ...}}
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from cli_checks import one_usage_error
from profiler import cli
from repo_paths import REPO

READY_TIMEOUT_S = 120  # a cap on waiting for the server, not a speed requirement


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory):
    import models.data as data_mod

    out = tmp_path_factory.mktemp("runs")
    full = data_mod.synthetic
    with pytest.MonkeyPatch.context() as patch:  # a smaller end-of-run test pass; the trace is the same
        patch.setattr(data_mod, "synthetic", lambda n, test_images=1000, seed=0: full(n, min(test_images, 1000), seed))
        rc = cli.main(
            [
                "run",
                "--device",
                "cpu",
                "--data",
                "synthetic",
                "--limit-images",
                "1000",
                "--epochs",
                "1",
                "--no-sample",
                "--quiet",
                "--scalars-every",
                "2",
                "--out",
                str(out),
                "--run-name",
                "r1",
            ]
        )
    assert rc == 0
    meta = json.loads((out / "r1" / "run.json").read_text())
    assert meta["profiler"]["trace"]
    return out


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return json.loads(body)


def wait_for(fetch, ready, what: str):
    """Poll `fetch()` until `ready(value)`; TensorBoard loads event files in the background."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    value = None
    while time.monotonic() < deadline:
        value = fetch()
        if ready(value):
            return value
        time.sleep(0.3)
    pytest.fail(f"TensorBoard never showed {what}; last answer: {value!r}")


@pytest.fixture(scope="module")
def board_log(tmp_path_factory) -> Path:
    """Where the server's stderr goes."""
    return tmp_path_factory.mktemp("tb") / "stderr.log"


@pytest.fixture(scope="module")
def board(runs_folder, board_log):
    log = board_log
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "DEVPROF_DEBUG")}
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "profiler", "tensorboard", str(runs_folder), "--port", "0"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=environ,
        )
    lines: queue.Queue = queue.Queue()
    out = proc.stdout
    assert out is not None  # stdout=PIPE

    def read():
        for line in out:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        try:
            first = lines.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            pytest.fail(f"devprof tensorboard printed no URL; stderr: {log.read_text()[-3000:]}")
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
        assert found, (first, log.read_text()[-3000:])
        yield found.group(0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_profile_plugin_lists_the_run_and_its_tools(board):
    runs = wait_for(lambda: get_json(board + "data/plugin/profile/runs"), bool, "profile runs")
    assert len(runs) == 1 and runs[0].startswith("r1/"), runs
    session = runs[0].split("/", 1)[1]
    run = urllib.parse.quote(runs[0], safe="")
    tools = get_json(f"{board}data/plugin/profile/run_tools?run={run}")
    names = {t.rstrip("@") for t in tools}  # "trace_viewer@" is the streaming trace viewer
    assert {"overview_page", "trace_viewer", "input_pipeline_analyzer"} <= names, tools
    hosts = get_json(f"{board}data/plugin/profile/hosts?run={run}&tag=overview_page")
    assert hosts and hosts[0]["hostname"], hosts
    assert session  # the session folder under plugins/profile


@pytest.mark.slow
def test_input_pipeline_page_has_the_train_steps(board, runs_folder):
    runs = wait_for(lambda: get_json(board + "data/plugin/profile/runs"), bool, "profile runs")
    run = urllib.parse.quote(runs[0], safe="")
    host = get_json(f"{board}data/plugin/profile/hosts?run={run}&tag=input_pipeline_analyzer")[0]["hostname"]
    tables = get_json(
        f"{board}data/plugin/profile/data?run={run}&tag=input_pipeline_analyzer&host={urllib.parse.quote(host)}"
    )
    window = json.loads((runs_folder / "r1" / "run.json").read_text())["profiler"]["window"]
    steps = [int(row["c"][0]["v"].split()[1]) for row in tables[1]["rows"]]
    assert steps and all(window[0] <= s < window[1] for s in steps), (steps, window)


@pytest.mark.slow
def test_scalars_plugin_has_the_loss(board):
    tags = wait_for(
        lambda: get_json(board + "data/plugin/scalars/tags"),
        lambda t: "step/loss" in t.get("r1", {}),
        "the step/loss scalar",
    )
    assert {"step/loss", "step/accuracy", "epoch/loss", "epoch/val_accuracy"} <= set(tags["r1"])
    url = board + "data/plugin/scalars/scalars?" + urllib.parse.urlencode({"run": "r1", "tag": "step/loss"})
    points = get_json(url)
    assert [p[1] for p in points] == [2, 4, 6, 8, 10]  # every 2 steps of the 10-step epoch
    assert all(p[2] > 0 for p in points)


def test_missing_folder_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["tensorboard", str(tmp_path / "nonexistent")]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip()]


@pytest.mark.slow
def test_the_console_shows_no_request_log_or_start_up_chatter(board, board_log):
    """One line per HTTP request (XProf's JSON log, werkzeug's access log) and TensorFlow's
    start-up lines would bury the URL the user needs."""
    get_json(board + "data/plugin/profile/runs")
    get_json(board + "data/plugin/scalars/tags")
    with urllib.request.urlopen(board, timeout=60) as response:
        assert response.status == 200
    time.sleep(0.5)
    log = board_log.read_text()
    assert "httpRequest" not in log and "GET /" not in log, log[-2000:]
    assert not re.search(r"^[IWE]\d{4} ", log, re.MULTILINE), log[-2000:]
    assert "cuInit" not in log and "absl::InitializeLog" not in log and "load_fast" not in log, log[-2000:]
    assert log.strip() == "", log[-2000:]


# ---------------------------------------------------------------- --port and the log folder


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_tensorboard_port_out_of_range_is_a_usage_error(tmp_path, capsys, port):
    """Was exit 1 after TensorBoard was started to find it out."""
    line = one_usage_error(cli.main(["tensorboard", "--port", port, str(tmp_path)]), capsys)
    assert line == f"error: --port must be a port number from 1 to 65535, or 0 for a free one (got {port})"


def test_a_tensorboard_logdir_that_is_a_file_says_so(tmp_path, capsys):
    afile = tmp_path / "runs"
    afile.write_text("x")
    line = one_usage_error(cli.main(["tensorboard", str(afile)]), capsys)
    assert "is a file, not a folder" in line and "no such folder" not in line
