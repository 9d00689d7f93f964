"""Round five of hostile inputs: the findings of fifty more tries, each a clear line instead of a
traceback, a silent guess or a wrong number. In-process, without TensorFlow."""

from __future__ import annotations

import json
import logging
import os

import pytest

import analysis
from analysis.read import run_files
from analysis.read.run_files import RunFileError
from cli_checks import one_usage_error
from profiler import cli
from run_fixtures import HEADER, make_run, step_line

MS = 1_000_000  # ns
BASE_NS = 1_700_000_000 * 10**9


def profiled_run_usage_error(capsys, out, *args: str) -> str:
    code = cli.main(["run", "--device", "cpu", "--data", "synthetic", "--limit-images", "64", "--epochs", "1",
                     "--quiet", "--no-sample", "--out", str(out), *args])
    return one_usage_error(code, capsys)


# ---------------------------------------------------------------- devprof run: options that cannot work


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999"])
def test_a_seed_outside_32_bits_is_a_usage_error_before_anything_is_written(tmp_path, capsys, seed):
    """Was `error: training failed: ValueError: expected non-negative integer`, exit 1, with a failed run
    directory left behind (Keras, NumPy and tf.data take 32-bit seeds)."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", "--seed", seed)
    assert line == f"error: --seed must be a whole number from 0 to 4294967295 (got {seed})"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("option, says", [(["--profile-steps", "1:2"], "--profile-steps 1:2 sets the traced window"),
                                          (["--python-tracer"], "--python-tracer traces Python calls")])
def test_profiler_window_options_with_no_profile_are_a_usage_error(tmp_path, capsys, option, says):
    """`--no-profile --profile-steps 1:2` ran without a trace and without a word about the window asked for."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", "--no-profile", *option)
    assert says in line and "--no-profile traces none" in line
    assert not (tmp_path / "runs").exists()


def test_the_largest_32_bit_seed_is_taken(tmp_path):
    from models.training import TrainConfig
    from profiler.train.config import MAX_SEED, RunConfig, UsageError

    RunConfig(out=str(tmp_path), train=TrainConfig(seed=MAX_SEED), profile=False).validate()
    with pytest.raises(UsageError, match="--seed"):
        RunConfig(out=str(tmp_path), train=TrainConfig(seed=MAX_SEED + 1)).validate()


# ---------------------------------------------------------------- run files as other tools save them


def test_a_run_json_saved_with_a_byte_order_mark_is_read(tmp_path):
    """Notepad and PowerShell write UTF-8 with a BOM: was `run.json: not valid JSON (Unexpected UTF-8 BOM ...)`."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    path = run / "run.json"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert run_files.read_run_json(path)["status"] == "complete"
    assert len(analysis.analyze(run).steps) == 6
    peak = tmp_path / "peak.json"
    peak.write_bytes(b"\xef\xbb\xbf" + json.dumps({"peak_flops_per_second": {"float32": 1e12}}).encode())
    assert run_files.read_peak_file(peak)["peak_flops_per_second"] == {"float32": 1e12}


def test_an_unknown_run_status_is_said_and_read_as_unknown(tmp_path):
    """Was ignored without a word: a run.json `status` that no devprof writes."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    path = run / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": "exploded"}))
    with pytest.warns(run_files.RunFileWarning, match="'status' must be one of running, complete, failed, interrupted"):
        meta = run_files.read_run_json(path)
    assert meta["status"] is None


def _steps_csv(tmp_path, data: bytes):
    path = tmp_path / "steps.csv"
    path.write_bytes(data)
    with pytest.raises(RunFileError) as info:
        run_files.read_steps_csv(path)
    return str(info.value)


def test_a_steps_csv_in_utf16_says_so_not_that_every_column_is_missing(tmp_path):
    text = "\n".join([HEADER, *[step_line(i) for i in range(3)]]) + "\n"
    message = _steps_csv(tmp_path, text.encode("utf-16"))
    assert "not UTF-8 text (UTF-16" in message and "save it as UTF-8 CSV" in message
    assert "missing columns" not in message


def test_a_steps_csv_separated_by_semicolons_says_so(tmp_path):
    """A spreadsheet where the decimal mark is a comma saves ';' between cells."""
    lines = [HEADER, *[step_line(i) for i in range(3)]]
    text = "\n".join(line.replace(",", ";").replace(".", ",") for line in lines) + "\n"
    assert "separated by semicolons, not commas" in _steps_csv(tmp_path, text.encode())


def test_a_steps_csv_without_its_header_names_its_first_line(tmp_path):
    text = "\n".join(step_line(i) for i in range(3)) + "\n"
    message = _steps_csv(tmp_path, text.encode())
    assert "first line is not steps.csv's header (got '1,0,1," in message and f"expected the header {HEADER}" in message


def test_a_steps_csv_missing_some_columns_still_names_them(tmp_path):
    lines = [HEADER, *[step_line(i) for i in range(3)]]
    text = "\n".join(",".join(line.split(",")[:4]) for line in lines) + "\n"
    assert _steps_csv(tmp_path, text.encode()).endswith("missing columns input_ms, call_ms, other_host_ms, step_ms, images")


# ---------------------------------------------------------------- traces


def test_a_marker_of_no_duration_after_the_last_step_is_no_step_of_0_ms(tmp_path):
    """Markers that hold nothing (`with Trace("train", step_num=k): pass` before each step): a step runs to
    the next marker, and the last one, which ends nowhere, counted as a 0 ms step in the mean (8 ms, not 10)."""
    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    space.hostnames.append("host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    for k in range(6):
        t = BASE_NS + 10 * MS + k * 10 * MS
        host.event(python, "train", t, t, step_num=k, _r=1)
    host.finish()
    result = analysis.analyze(_write_space(space, tmp_path / "t.xplane.pb"))
    assert result.step_source == "markers" and len(result.steps) == 6
    assert result.mean["step_ms"] == pytest.approx(10.0)
    assert bool(result.steps["partial"].iloc[-1]) and not result.steps["partial"].iloc[:-1].any()


# ---------------------------------------------------------------- environment


def test_no_gpu_under_cuda_visible_devices_names_the_variable(monkeypatch):
    from profiler.device.devices import DeviceError, resolve
    from fake_backend import FakeBackend

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError) as info:
        resolve("gpu", backend=FakeBackend(gpus=0))
    assert "CUDA_VISIBLE_DEVICES='' is set and hides every GPU it does not name" in str(info.value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(DeviceError) as info:
        resolve("gpu", backend=FakeBackend(gpus=0))
    assert "CUDA_VISIBLE_DEVICES" not in str(info.value) and "NVIDIA driver" in str(info.value)


@pytest.mark.parametrize("value, warned", [("abc", True), ("", False), ("1", False), (" 3 ", False)])
def test_a_tf_log_level_that_is_no_number_is_replaced_with_a_warning(monkeypatch, capsys, value, warned):
    """TensorFlow reads 'abc' as 0 and printed every INFO line of its C++ log; devprof's filter read it as 2."""
    from profiler.device import quiet

    monkeypatch.setenv(quiet.LOG_LEVEL_VAR, value)
    quiet.configure()
    err = capsys.readouterr().err
    assert ("warning: TF_CPP_MIN_LOG_LEVEL='abc' is not a log level" in err) is warned
    expected = value if value.strip() else quiet.DEFAULT_LOG_LEVEL
    assert os.environ[quiet.LOG_LEVEL_VAR] == (quiet.DEFAULT_LOG_LEVEL if warned else expected)


def test_tensorflows_python_warnings_are_kept_off_only_inside_the_block(monkeypatch, caplog):
    """`devprof peak` traces one tf.function per size tried: TensorFlow printed its retracing advice."""
    from profiler.device import quiet

    monkeypatch.delenv(quiet.DEBUG_VAR, raising=False)
    monkeypatch.setenv(quiet.LOG_LEVEL_VAR, "2")
    logger = logging.getLogger("tensorflow")
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        with quiet.tensorflow_python_warnings_off():
            logger.warning("5 out of the last 13 calls triggered tf.function retracing")
        logger.warning("after the block")
        monkeypatch.setenv(quiet.DEBUG_VAR, "1")
        with quiet.tensorflow_python_warnings_off():
            logger.warning("asked for everything")
    assert [record.message for record in caplog.records] == ["after the block", "asked for everything"]


# ---------------------------------------------------------------- other commands


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


def test_a_cifar_archive_that_is_no_archive_is_one_line(tmp_path):
    """tarfile's message lists every compression it tried, a line each."""
    from models.data import DataError, _read_py_tar

    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(os.urandom(4096))
    with pytest.raises(DataError) as info:
        _read_py_tar(archive)
    assert "\n" not in str(info.value) and "not a tar archive, gzipped or not" in str(info.value)


def test_mcp_list_runs_of_a_file_is_refused_not_an_empty_list(tmp_path):
    from profiler.cli.mcp_server import Refused, Roots, Tools

    make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    tools = Tools(Roots([tmp_path]))
    with pytest.raises(Refused, match="a file, not a folder"):
        tools.list_runs(root="run/run.json")
    assert json.loads(tools.list_runs(root="run"))["runs_total"] == 1


@pytest.mark.parametrize("out", [None, 7, b"runs"])
def test_profile_out_that_is_no_path_is_a_type_error_not_a_folder_named_after_it(tmp_path, monkeypatch, out):
    """`profile(out=None)` wrote its run into ./None/."""
    import profiler

    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="out must be a folder path"):
        profiler.profile(out, run_name="x")
    assert list(tmp_path.iterdir()) == []


def test_a_model_spec_naming_a_text_file_says_it_is_no_python_file(tmp_path, monkeypatch):
    """`--model notes.txt:build` said: no module named 'notes' here."""
    from models.user_model import ModelError, load_function

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("def build(): pass\n")
    with pytest.raises(ModelError, match=r"notes\.txt is not a Python file \(\.py\)"):
        load_function("notes.txt:build", "--model")


def test_a_model_file_spec_naming_a_folder_says_so(tmp_path):
    from models.user_model import ModelError, load_function

    (tmp_path / "pkg.py").mkdir()
    with pytest.raises(ModelError, match=r"pkg\.py is a folder, not a Python file"):
        load_function(f"{tmp_path / 'pkg.py'}:build", "--model")


# ---------------------------------------------------------------- analyze and compare: outputs found wrong before the analysis


def test_an_output_that_is_a_folder_or_an_out_that_is_a_file_is_a_usage_error_before_the_analysis(tmp_path, capsys):
    """Were exit 1 after the whole analysis ('runs is a folder', '--out afile: File exists')."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    folder = tmp_path / "reports"
    folder.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    line = one_usage_error(cli.main(["analyze", str(run), "-o", str(folder)]), capsys)
    assert line == f"error: -o {folder}: is a folder; name the file, e.g. {folder / 'report.html'}"
    line = one_usage_error(cli.main(["analyze", str(run), "--out", str(afile)]), capsys)
    assert line.startswith(f"error: --out {afile}: is a file, not a folder")
    line = one_usage_error(cli.main(["compare", str(run), "-o", str(folder)]), capsys)
    assert line == f"error: -o {folder}: is a folder; name the file, e.g. {folder / 'compare.txt'}"
    assert not (run / "analysis").exists() and list(folder.iterdir()) == [] and afile.read_text() == "x"


def test_a_peak_file_entry_that_is_skipped_is_a_warning_line(tmp_path, capsys):
    """Was Python's own warning format: 'analysis/read/run_files.py:191: RunFileWarning: ...' and its source line."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    peak = tmp_path / "peak.json"
    peak.write_text(json.dumps({"peak_flops_per_second": {"float32": 2e11, "bfloat16": "fast"}}))
    code = cli.main(["analyze", str(run), "--format", "summary", "--peak-file", str(peak)])
    err = capsys.readouterr().err
    assert code == 0
    assert [line for line in err.splitlines() if "bfloat16" in line] == [
        f"warning: {peak}: peak rates must be positive numbers (FLOP/s up to 1e+18, B/s up to 1e+16); ignored "
        "peak_flops_per_second.bfloat16 'fast'"]
    assert "RunFileWarning" not in err


class _FullDisk:
    """stdout redirected to a full disk (`> /dev/full`): every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass

    def fileno(self):
        raise ValueError("no descriptor")


@pytest.mark.parametrize("command, what", [("analyze", "the analysis"), ("compare", "the comparison")])
def test_stdout_on_a_full_disk_is_one_error_line(tmp_path, capsys, monkeypatch, command, what):
    """Was 'error: analyze failed: OSError: [Errno 28] ... (set DEVPROF_DEBUG=1 for the traceback)', as for a bug."""
    run = make_run(tmp_path / "run", [step_line(i) for i in range(6)])
    args = [command, str(run)] + (["--format", "json"] if command == "analyze" else [])
    monkeypatch.setattr("sys.stdout", _FullDisk())
    code = cli.main(args)
    err = capsys.readouterr().err
    assert code == 1
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: cannot write {what} to stdout: No space left on device"]


def test_a_run_path_that_links_to_itself_is_named_as_a_link_not_as_missing(tmp_path, capsys):
    """Was `no such file or directory`: exists() follows the link, and a loop leads nowhere."""
    loop = tmp_path / "run"
    loop.symlink_to(loop)
    assert cli.main(["analyze", str(loop)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {loop} is a link that leads nowhere (to {loop}: a loop of links or a missing target)"]


@pytest.mark.parametrize("argv", [["run", "--profile-steps", "-1:2"], ["analyze", "runs/a", "--step-name", "-train"]])
def test_a_value_that_begins_with_a_dash_is_told_how_to_write_it(argv, capsys):
    line = one_usage_error(cli.main(argv), capsys)
    option = argv[-2]
    assert f"argument {option}: expected one argument" in line and f"is written {option}=VALUE" in line


def test_two_folders_naming_the_same_worker_read_the_one_devprof_writes_and_say_so(tmp_path):
    for name in ("worker-00", "worker-0", "worker-1", "worker-001", "worker-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / run_files.RUN_JSON).write_text("{}")
    with pytest.warns(run_files.RunFileWarning) as caught:
        workers = run_files.worker_dirs(tmp_path)
    assert [path.name for path in workers] == ["worker-0", "worker-1", "worker-2"]
    messages = sorted(str(item.message) for item in caught)
    assert len(messages) == 2
    assert "worker-0, worker-00 all name worker 0; worker-0 is read" in messages[0]
    assert "worker-1, worker-001 all name worker 1; worker-1 is read" in messages[1]


@pytest.mark.parametrize("option", ["--inject-input-delay-ms", "--inject-host-delay-ms"])
@pytest.mark.parametrize("value", ["1e9", "60001"])
def test_an_injected_delay_beyond_a_minute_a_step_is_a_usage_error(tmp_path, capsys, option, value):
    """Was accepted: 1e9 ms slept in every step is a run that never ends."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", option, value)
    assert line == f"error: {option} must be at most 60000 (a minute in every step; got {float(value):g})"
    assert not (tmp_path / "runs").exists()


def test_a_sample_interval_with_no_sampling_is_a_usage_error(tmp_path, capsys):
    """Was ignored in silence: --no-sample runs no sampler, so an interval says nothing."""
    line = profiled_run_usage_error(capsys, tmp_path / "runs", "--sample-interval", "0.2")
    assert line == ("error: --sample-interval 0.2 sets how often the samplers sample and --no-sample runs none: "
                    "leave one of them out")
    assert not (tmp_path / "runs").exists()
