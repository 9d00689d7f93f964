"""Shortened names keep what tells rows apart, in every format that shortens (text, Markdown, HTML)."""

import dataclasses
import json
import re

import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import analyze, pipeline
from analysis.render import tables
from analysis.render.names import distinct_names
from profiler import cli

LAYERS = ("conv2d_1", "conv2d_3", "conv2d_5")
BACKPROP = [f"gradient_tape/seed_cifar10_cnn/{layer}/Conv2D/Conv2DBackpropFilter" for layer in LAYERS]
STAGES = [
    "Iterator::Model::Prefetch::Rebatch::BatchV2::ShuffleAndRepeat::TensorSlice",
    "Iterator::Model::Prefetch::Rebatch::BatchV2::ShuffleAndRepeat::ParallelMapV2",
    "Iterator::Model::Prefetch::Rebatch::BatchV2::ShuffleAndRepeat",
]


def _ops() -> pd.DataFrame:
    names = [*BACKPROP, "gradient_tape/seed_cifar10_cnn/conv2d_1/Conv2D/Conv2DBackpropInput", "AddN"]
    return pd.DataFrame(
        {
            "op": names,
            "type": ["Conv2DBackpropFilter"] * 3 + ["Conv2DBackpropInput", "AddN"],
            "device": "/host:CPU",
            "count_per_step": 1.0,
            "ms_per_step": [5.0, 4.0, 3.0, 2.0, 1.0],
            "compute_pct": [33.3, 26.7, 20.0, 13.3, 6.7],
        }
    )


@pytest.fixture(scope="module")
def with_ops(tmp_path_factory):
    """An analysis whose op table has rows that share long prefixes and the op suffix."""
    trace = fx.write_unrepeated_trace(tmp_path_factory.mktemp("names") / "plugins/profile/s/h.xplane.pb")
    return dataclasses.replace(analyze(trace), ops=_ops())


def test_rows_sharing_long_prefixes_come_out_distinct_and_keep_their_distinguishing_part():
    assert all(len(name) > tables.MAX_NAME for name in BACKPROP)
    shown = tables.short_names(pd.DataFrame({"op": BACKPROP}))["op"].tolist()
    assert len(set(shown)) == 3 and all(len(name) <= tables.MAX_NAME for name in shown), shown
    assert [layer in name for layer, name in zip(LAYERS, shown)] == [True] * 3, shown
    assert all(name.endswith("/Conv2DBackpropFilter") for name in shown), shown


def test_each_shortened_name_matches_only_its_own_row():
    names = [
        *BACKPROP,
        "gradient_tape/seed_cifar10_cnn/conv2d_1/Conv2D/Conv2DBackpropInput",
        "seed_cifar10_cnn/conv2d_1/Conv2D",
        *STAGES,
    ]
    shown = tables.short_names(pd.DataFrame({"n": names}))["n"].tolist()
    for name, short in zip(names, shown):
        pattern = re.compile(".+".join(re.escape(p) for p in short.split("…")))
        assert [n for n in names if pattern.fullmatch(n)] == [name], (short, name)
    assert len(set(shown)) == len(names)


def test_names_that_fit_and_cells_that_are_not_text_are_kept_whole():
    shown = tables.short_names(pd.DataFrame({"op": ["AddN", None, "sequential/dense/Relu"]}))["op"]
    assert shown[0] == "AddN" and pd.isna(shown[1]) and shown[2] == "sequential/dense/Relu"


def test_a_kernel_name_loses_its_template_arguments_first():
    kernel = "void tensorflow::functor::ShuffleInTensor3Simple<float, 2, 1, 0, false>(int, float const*, float*)"
    assert tables.short_name(kernel, 60) == "void tensorflow::functor::ShuffleInTensor3Simple<…>(…)"
    assert len(tables.short_name("x" * 300, 60)) == 60


def test_the_text_op_and_stage_tables_tell_rows_apart(with_ops):
    analysis = dataclasses.replace(
        with_ops, input_stages=pd.DataFrame({"stage": STAGES, "ms_per_batch": [0.3, 0.2, 0.1], "calls": [128, 128, 1]})
    )
    text = analysis.render("text")
    ops_block = text.split("top ops")[1].split("\n\n")[0]
    for layer in LAYERS:
        assert re.search(rf"…/{layer}/\S*Conv2DBackpropFilter", ops_block), ops_block
    stages_block = text.split("tf.data stages")[1].split("\n\n")[0]
    assert "TensorSlice" in stages_block and "ParallelMapV2" in stages_block, stages_block


def test_the_html_ops_table_wraps_only_at_slashes_and_keeps_the_distinguishing_part(with_ops):
    html = with_ops.render("html")
    section = html[html.index('id="ops"') :]
    section = section[: section.index("</table>")]
    cells = re.findall(r"<td class=\"name path\"[^>]*>(.*?)</td>", section)
    devices = [c for c in cells if "host:CPU" in c]
    assert devices and all(c == "/host:CPU" for c in devices)  # no break inside "/host:CPU"
    for layer in LAYERS:
        assert any(f"/<wbr>{layer}/<wbr>" in c for c in cells), cells
    assert re.search(r"td\.path\{overflow-wrap:normal\}", html)


def test_the_html_name_shortened_for_a_cell_keeps_the_whole_name_as_its_tooltip(with_ops):
    long = [f"model/{'block_' * 20}{layer}/Conv2D/Conv2DBackpropFilter" for layer in LAYERS]
    html = dataclasses.replace(with_ops, ops=_ops().assign(op=[*long, "a", "b"])).render("html")
    for name, layer in zip(long, LAYERS):
        tooltip = re.search(rf'<td class="name path" title="{re.escape(name)}">(.*?)</td>', html)
        assert tooltip and layer in tooltip.group(1) and "…" in tooltip.group(1)


def test_op_diff_lines_tell_rows_apart():
    rows = pd.DataFrame(
        {
            "op": BACKPROP + ["AddN"],
            "only_in": "",
            "a_ms": [3.0, 2.0, 1.0, 0.5],
            "b_ms": [1.0, 1.0, 0.5, 0.5],
            "share_pct": [50.0, 25.0, 12.5, 12.5],
        }
    )
    rows["op"] = [name.replace("seed_cifar10_cnn", "seed_cifar10_cnn_with_a_long_scope_name") for name in rows["op"]]
    lines = tables.describe(rows, "ms_per_step", -4.0, "gpu", "cpu")[1:]
    names = [line.split("  - ")[1].split(":")[0] for line in lines]
    assert len(set(names)) == 4 and all(len(name) <= tables.MAX_NAME for name in names), names
    assert [layer in name for layer, name in zip(LAYERS, names)] == [True] * 3


def test_the_wildcard_match_agrees_with_the_regular_expression_it_replaces():
    import random
    import re

    from analysis.render.names import Wildcard

    rng = random.Random(37)
    for _ in range(20000):
        pieces: list = []
        for _ in range(rng.randint(0, 4)):
            if rng.random() < 0.5 and (not pieces or pieces[-1] is not None):
                pieces.append(None)
            else:
                text = "".join(rng.choice("ab:") for _ in range(rng.randint(1, 2)))
                if pieces and pieces[-1] is not None:
                    pieces[-1] += text
                else:
                    pieces.append(text)
        candidate = "".join(rng.choice("ab:") for _ in range(rng.randint(0, 7)))
        regex = "".join(".+" if p is None else re.escape(p) for p in pieces)
        assert Wildcard(pieces).fullmatch(candidate) == (re.fullmatch(regex, candidate, re.DOTALL) is not None), (
            pieces,
            candidate,
        )


def test_stage_names_nested_hundreds_deep_are_told_apart():
    """`ds.concatenate` in a loop nests `Concatenate[0]::` once per piece: a regular expression per
    candidate took minutes on 200 of them (bench/bench_names.py); the names must still come out distinct."""
    chain = "::".join(["Concatenate[0]"] * 200)
    stages = [f"Iterator::Root::Prefetch::{chain}::{kind}" for kind in ("TensorSlice", "Map", "BatchV2", "Shuffle")]
    short = distinct_names(stages, 60)
    assert len(set(short)) == 4 and all(len(name) <= 60 for name in short), short
    assert [name.rsplit("::", 1)[-1] for name in short] == ["TensorSlice", "Map", "BatchV2", "Shuffle"]


def test_chart_labels_drop_the_start_run_names_share_and_stay_distinct():
    """hbars' labels (the compare chart): default run names share their date stamp, device and host."""
    from analysis.render.names import distinct_labels

    stamp = "20250101-120000-gpu-gpu-1060-workstation"
    assert distinct_labels([stamp, f"{stamp}-2", f"{stamp}-3 *"], 32) == [
        "…workstation",
        "…workstation-2",
        "…workstation-3 *",
    ]
    host = "gpu-gpu-1060-workstation.lab.example.com"  # the time tells them apart: the shared end goes too
    short = distinct_labels([f"20250101-{t}-{host}" for t in ("093015", "120000", "154500")], 32)
    assert short == ["…093015…", "…120000…", "…154500…"]
    assert distinct_labels(["fast", "slow_input"], 32) == ["fast", "slow_input"]  # names that fit stay whole
    assert distinct_labels(["a" * 50], 32) == ["a" * 15 + "…" + "a" * 16]  # one name: its middle goes
    # The difference in a middle that the cut would remove: the labels show that stretch instead.
    pair = distinct_labels(["x" * 20 + "A" + "y" * 40, "x" * 20 + "B" + "y" * 40], 20)
    assert len(set(pair)) == 2 and "A" in pair[0] and "B" in pair[1] and all(len(s) <= 20 for s in pair), pair


def run_cli(argv, capsys):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


LONG_KERNEL = (
    "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<"
    + "Eigen::TensorMap<Eigen::Tensor<float, 4, 1, long>, 16, Eigen::MakePointer>, " * 14
    + "Eigen::GpuDevice>, long>>(Eigen::TensorEvaluator<"
    + "const float, " * 20
    + "long>, long)"
)


# ---------------------------------------------------------------- long steps.csv, long kernel names


def test_text_shows_at_most_20_steps_and_short_kernel_names(tmp_path, capsys):
    assert len(LONG_KERNEL) > 1200
    trace = fx.write_synthetic_device_trace(
        tmp_path / "plugins/profile/s/h.xplane.pb", gpus=1, empty_gpus=0, steps=81, kernel_name=LONG_KERNEL
    )
    code, out, err = run_cli(["analyze", trace.path, "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 200, max(lines, key=len)
    header = next(i for i, line in enumerate(lines) if line.startswith(" step "))
    rows = [line for line in lines[header + 1 : header + 30] if line.strip()[:1].isdigit()]
    assert len(rows) == 20, lines[header : header + 25]
    assert "… 61 more steps in --format json / step_breakdown.csv" in out
    assert "EigenMetaKernel<…>(…)" in out
    document = json.loads(pipeline.analyze(trace.path).render("json"))
    assert len(document["steps"]) == 81 and LONG_KERNEL in {op["op"] for op in document["ops"]}
    assert LONG_KERNEL in set(pd.read_csv(tmp_path / "out" / "ops.csv")["op"])
    assert len(pd.read_csv(tmp_path / "out" / "step_breakdown.csv")) == 81


def test_a_long_steps_csv_is_read_whole_and_printed_short(tmp_path, capsys):
    rows = 100_000
    run = tmp_path / "run"
    run.mkdir()
    frame = pd.DataFrame(
        {
            "epoch": 1 + pd.RangeIndex(rows) // 1000,
            "step": pd.RangeIndex(rows),
            "steps": 1,
            "start_time_s": 1.7e9 + 0.01 * pd.RangeIndex(rows),
            "input_ms": 1.0,
            "call_ms": 8.0,
            "other_host_ms": 1.0,
            "step_ms": 10.0,
            "images": 100,
            "extra_column": "x",
        }
    )
    frame.to_csv(run / "steps.csv", index=False)
    (run / "run.json").write_text(
        json.dumps(
            {
                "status": "complete",
                "device": {"kind": "cpu"},
                "epochs": [{"epoch": e, "seconds": 10.5, "images": 100_000} for e in range(1, 101)],
            }
        )
    )
    code, out, err = run_cli(["analyze", run, "--out", tmp_path / "out"], capsys)
    assert code == 0 and not lines_starting(err, "warning:"), err
    assert len(out.splitlines()) < 200
    assert f"… {rows - 20} more steps" in out
    assert len(pd.read_csv(tmp_path / "out" / "step_breakdown.csv")) == rows
    assert len(pd.read_csv(tmp_path / "out" / "epoch_breakdown.csv")) == 100
