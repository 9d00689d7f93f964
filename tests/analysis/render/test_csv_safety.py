"""Text cells that a spreadsheet would run as formulas are quoted; numbers stay numbers."""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import pipeline
from analysis.render.csv_safety import frame_csv, needs_quote, neutralize_cell, neutralize_frame
from compare_fixtures import make_run as make_compare_run
from profiler import cli
from run_fixtures import make_run as make_small_run
from run_fixtures import step_line


@pytest.mark.parametrize(
    "text",
    [
        '=HYPERLINK("http://x","click")',
        "=1+2",
        "+1+2",
        "-1+2",
        "@SUM(A1:A2)",
        "\t=1+2",
        "\r=1+2",
        "-",
        "+",
        "=",
        "-cmd|' /C calc'!A0",
        "-inf",
        "-1.5x",
    ],
)
def test_formula_text_gets_a_leading_quote(text):
    assert neutralize_cell(text) == "'" + text


@pytest.mark.parametrize(
    "value", ["run-1", "cpu", "", " =1+2", "a=b", "1+2", "'=1", "é=", "-1.5", "+3", "-2e-3", ".5", "-0", "12"]
)
def test_other_text_and_plain_numbers_stay(value):
    assert neutralize_cell(value) == value


@pytest.mark.parametrize("value", [-1, -1.5, 0, np.int64(-3), np.float64(-2.5), True, None])
def test_numbers_stay_numbers(value):
    assert neutralize_cell(value) is value


def test_nan_stays_nan():
    assert math.isnan(neutralize_cell(float("nan")))


def test_a_frame_keeps_its_numeric_columns_and_quotes_its_text():
    frame = pd.DataFrame(
        {
            "run": ["=1+2", "base", "@x"],
            "seconds": [-1.0, 2.0, 3.5],
            "images": [1, 2, 3],
            "note": ["-1.5", None, "+SUM(A1)"],
        }
    )
    safe = neutralize_frame(frame)
    assert list(safe["run"]) == ["'=1+2", "base", "'@x"]
    assert list(safe["note"][[0, 2]]) == ["-1.5", "'+SUM(A1)"] and pd.isna(safe["note"][1])
    assert safe["seconds"].dtype == frame["seconds"].dtype and list(safe["seconds"]) == [-1.0, 2.0, 3.5]
    assert safe["images"].dtype == frame["images"].dtype
    assert list(frame["run"]) == ["=1+2", "base", "@x"]  # the input is not changed
    text = safe.to_csv(index=False)
    assert "'=1+2" in text and "\n=1+2" not in text and ",-1.0," in text


def test_object_categorical_and_string_columns():
    frame = pd.DataFrame(
        {
            "obj": pd.Series(["=a", None, 3], dtype=object),
            "cat": pd.Categorical(["=b", "b", "b"]),
            "text": pd.Series(["@c", None, "d"], dtype="string"),
        }
    )
    safe = neutralize_frame(frame)
    assert list(safe["obj"]) == ["'=a", None, 3]
    assert list(safe["cat"]) == ["'=b", "b", "b"]
    assert list(safe["text"][[0, 2]]) == ["'@c", "d"] and pd.isna(safe["text"][1])


def test_column_names_are_text_too():
    safe = neutralize_frame(pd.DataFrame({"=evil": ["x"], "ok": [1]}))
    assert list(safe.columns) == ["'=evil", "ok"]
    kept = neutralize_frame(pd.DataFrame({"=evil": ["x"]}), header=False)
    assert list(kept.columns) == ["=evil"]


def test_a_quoted_cell_reads_back_as_text():
    safe = neutralize_frame(pd.DataFrame({"run": ["=1+2"], "n": [-4]}))
    back = pd.read_csv(io.StringIO(safe.to_csv(index=False)))
    assert back["run"][0] == "'=1+2" and back["n"][0] == -4


def test_the_csvs_a_run_writes_hold_numbers_only(tmp_path):
    """steps.csv and the samplers' CSVs carry no text a user chose (run names, paths, notes are
    in run.json): nothing in them to neutralise, and text cannot get in."""
    import csv

    from models.training import StepRecord
    from profiler.record import rundir
    from profiler.samplers.runner import format_value

    writer = rundir.StepsWriter(tmp_path / "steps.csv")
    writer.write(
        StepRecord(
            epoch=1, step=0, steps=1, start_time_s=1.5, input_ms=-0.0, call_ms=2.0, other_host_ms=0.1, images=100
        )
    )
    writer.close()
    header, row = list(csv.reader((tmp_path / "steps.csv").open()))
    assert all(not needs_quote(name) for name in header)
    assert [float(cell) for cell in row]  # every cell a number
    with pytest.raises(ValueError):
        format_value(cast(Any, "=1+2"))  # text where a number belongs: refused
    assert format_value(-1.5) == "-1.5"


# ---------------------------------------------------------------- frame_csv: the same text, faster


def _frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    floats = rng.integers(0, 2**64, 20_000, dtype=np.uint64).view(np.float64)  # every exponent
    floats = np.concatenate([floats[np.isfinite(floats)], [0.0, -0.0, np.inf, -np.inf, np.nan, 1e16, 1e-5, 0.1]])
    return {
        "every kind": pd.DataFrame(
            {
                "run": ["=1+2", "base", "@x", "a,b", 'q"t', "line\nbreak", "cr\rx", "", None, " sp"] * 3,
                "seconds": [-1.0, 2.0, np.nan, 1e16, -0.0, 0.1, 1e-7, np.inf, 3.0, 4.0] * 3,
                "images": list(range(30)),
                "flag": [True, False] * 15,
                "n": pd.array([1, None, 3] * 10, dtype="Int64"),
                "cat": pd.Categorical(["=b", "b", None] * 10),
                "text": pd.Series(["@c", None, "d,e"] * 10, dtype="string"),
                "s": pd.Series(["-1.5", "+3", "-x"] * 10, dtype="str"),
                "u": np.arange(30, dtype=np.uint64),
            }
        ),
        "floats of every size": pd.DataFrame({"a": floats, "b": floats[::-1]}),
        "1 and 1.0 in one object column": pd.DataFrame({"a": pd.Series([1, 1.0, "x", True], dtype=object), "b": 1}),
        "no rows": pd.DataFrame({"a": pd.Series([], dtype=object), "b": pd.Series([], dtype=float)}),
        "one column (a lone empty cell is quoted)": pd.DataFrame({"a": ["", "x"]}),
        "names to neutralise and quote": pd.DataFrame({"=evil": ["x"], "a,b": [1.5]}),
        "names that are numbers": pd.DataFrame({0: ["x"], 1: [1.5]}),
        "float32": pd.DataFrame({"a": np.array([0.1], dtype=np.float32), "b": [1]}),
        "nothing but missing": pd.DataFrame({"a": [None, None], "b": [np.nan, np.nan]}),
        "lists": pd.DataFrame({"a": [[1, 2], [3]], "b": [1, 2]}),
        "categories that are numbers": pd.DataFrame({"a": pd.Categorical([1, 2]), "b": [1, 2]}),
    }


@pytest.mark.parametrize("name", list(_frames()))
def test_frame_csv_is_the_text_pandas_writes(name):
    frame = _frames()[name]
    assert frame_csv(frame) == neutralize_frame(frame).to_csv(index=False)


def test_frame_csv_writes_a_long_frame_faster():
    """memory.csv holds every allocator event; per distinct text and with Python's float repr it is
    about 3x quicker than pandas (0.12-0.17 s against 0.35-0.49 s at 47,840 rows, BENCHMARKS.md)."""
    import time

    rows = 60_000
    frame = pd.DataFrame(
        {
            "allocator": pd.Series(["mklcpu", "cpu"] * (rows // 2), dtype="str"),
            "time_ms": np.arange(rows) / 7.0,
            "bytes": np.arange(rows, dtype=float) * 256.0,
            "op": pd.Series(["Conv2D", None, "=x"] * (rows // 3) + ["y"] * (rows % 3), dtype=object),
            "step": pd.array(np.arange(rows), dtype="Int64"),
        }
    )
    start = time.perf_counter()
    fast = frame_csv(frame)
    fast_s = time.perf_counter() - start
    start = time.perf_counter()
    slow = neutralize_frame(frame).to_csv(index=False)
    slow_s = time.perf_counter() - start
    assert fast == slow
    assert fast_s < slow_s, (fast_s, slow_s)


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def device_trace(tmp_path_factory):
    return fx.write_synthetic_device_trace(
        tmp_path_factory.mktemp("gpu") / "plugins/profile/s/h.xplane.pb", gpus=2, empty_gpus=0
    )


FORMULA = '=HYPERLINK("evil.example","click")'


# ---------------------------------------------------------------- formula text in every CSV


def test_analyze_output_csvs_quote_formula_text(device_trace, tmp_path):
    result = pipeline.analyze(device_trace.path)
    ops = result.ops.copy()
    ops.loc[0, "op"] = FORMULA
    ops.loc[1, "type"] = "@SUM(A1)"
    rec = pd.DataFrame({"step": [1], "note": ["-cmd"], "step_ms_diff": [-1.5]})
    run = pipeline.analyze(make_small_run(tmp_path / "run", [step_line(i) for i in range(6)]))
    assert run.epochs is not None
    epochs = run.epochs.assign(label="+x")
    steps = result.steps.copy()
    steps["name"] = "=1+2"
    hostile = dataclasses.replace(result, ops=ops, reconciliation=rec, epochs=epochs, steps=steps)
    out = tmp_path / "out"
    written = pipeline.Analysis.write(hostile, out)
    for name in ("ops.csv", "trace_vs_steps.csv", "epoch_breakdown.csv", "step_breakdown.csv"):
        assert out / name in written
    assert pd.read_csv(out / "ops.csv")["op"][0] == "'" + FORMULA
    assert pd.read_csv(out / "ops.csv")["type"][1] == "'@SUM(A1)"
    reconciled = pd.read_csv(out / "trace_vs_steps.csv")
    assert reconciled["note"][0] == "'-cmd" and reconciled["step_ms_diff"][0] == -1.5  # numbers stay numbers
    assert pd.read_csv(out / "epoch_breakdown.csv")["label"][0] == "'+x"
    assert set(pd.read_csv(out / "step_breakdown.csv")["name"]) == {"'=1+2"}
    assert set(pd.read_csv(io.StringIO(hostile.render("csv")))["name"]) == {"'=1+2"}


def test_compare_csv_quotes_run_path_label_why_and_external_notes(tmp_path, capsys):
    evil = make_compare_run(tmp_path, FORMULA, device="-cmd")
    make_compare_run(tmp_path, "base", device="Test CPU", epoch_seconds=(3.0, 1.0, 1.0))
    external = tmp_path / "ext.csv"
    external.write_text("device,seconds_per_epoch,notes\n@dev,2.0,=1+2\n")
    code, out, err = run_cli(["compare", evil, tmp_path / "base", "--external", external, "--format", "csv"], capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    row = table[table["run"].str.contains("HYPERLINK")].iloc[0]
    assert row["run"] == "'" + FORMULA
    assert row["label"] == "'-cmd" and row["device"] == "'-cmd" and row["why"].startswith("'-cmd")
    ext = table[table["external"]].iloc[0]
    assert ext["notes"] == "'=1+2" and ext["run"] == "'@dev"
    for cell in map(str, table.select_dtypes(exclude="number").stack()):
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
    assert table["seconds_per_epoch"].dtype.kind == "f"


def test_compare_csv_quotes_a_path_that_starts_like_a_formula(tmp_path, capsys, monkeypatch):
    make_compare_run(tmp_path, "-run")
    make_compare_run(tmp_path, "b", epoch_seconds=(3.0, 1.0, 1.0))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["compare", "--format", "csv", "--", "-run", "b"], capsys)
    assert code == 0, err
    table = pd.read_csv(io.StringIO(out))
    assert "'-run" in set(table["path"]) and "'-run" in set(table["run"])
