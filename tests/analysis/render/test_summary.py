"""`devprof analyze --format summary`: the summary for agents (`devprof.summary/1`), valid against its
JSON Schema in docs/ on every kind of analysis, the same figures as the full JSON, and at most 8 KB
on an analysis built to be as large as possible."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pandas as pd
import pytest

import analysis
import trace_fixtures as fx
from analysis.breakdown.memory import MemoryReport, OomAtFailure, WorkerMemory
from analysis.breakdown.memory_allocators import AllocatorPeak, Live
from analysis.render import summary
from job_fixtures import write_job
from marker_traces import marker_trace
from memory_fixtures import write_memory_trace
from profiler import cli
from run_fixtures import make_run, step_line
from summary_checks import rendered


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    return analysis.analyze(marker_trace(tmp_path_factory.mktemp("cpu") / "host.xplane.pb"))


def test_a_cpu_trace_summary_carries_the_verdict_and_its_saving(cpu):
    document = rendered(cpu)
    full = cpu.to_json()
    assert document["schema"] == "devprof.summary/1"
    assert document["verdict"]["bound"] == full["verdict"]["bound"] is not None
    assert document["verdict"]["saving_ms"] == pytest.approx(full["verdict"]["saving_ms"], rel=1e-3)
    assert document["verdict"]["fix"] == full["verdict"]["advice"][0]
    assert document["step_ms"] == pytest.approx(10.0) and document["steps_used"] == full["steps_used"]
    assert sum(document["parts_pct"].values()) == pytest.approx(100, abs=0.1)
    assert document["findings_total"] == len(full["findings"]) and document["ops_total"] == len(full["ops"])
    assert [op["ms_per_step"] for op in document["ops"]] == pytest.approx(
        [op["ms_per_step"] for op in full["ops"][: summary.TOP_OPS]], rel=1e-3
    )


def test_a_gpu_trace_summary_ranks_its_ops_with_their_roofline_share(tmp_path):
    trace = fx.write_synthetic_device_trace(tmp_path / "plugins" / "profile" / "s" / "synth-host.xplane.pb")
    result = analysis.analyze(trace.path)
    document = rendered(result)
    assert document["device"] == result.device and document["ops"]
    top = result.ops.iloc[0]
    assert document["ops"][0]["op"] == top["op"] and document["ops"][0]["device"] == top["device"]
    assert all("ceiling_pct" in op for op in document["ops"])
    shares = [op["compute_pct"] for op in document["ops"]]
    assert shares == sorted(shares, reverse=True)


def test_a_job_summary_names_its_workers(tmp_path):
    job = write_job(tmp_path)
    result = analysis.analyze(job.path)
    document = rendered(result)
    assert document["workers"]["count"] == len(result.workers) == 2
    if result.straggler is not None:
        assert document["workers"]["straggler"]["worker"] == str(result.straggler["worker"])
    assert document["utilization"]["cpu_util_mean_pct"] is not None  # the workers' samplers


def test_an_analysis_without_a_verdict_says_why(tmp_path):
    result = analysis.analyze(marker_trace(tmp_path / "host.xplane.pb", steps=3))
    assert result.verdict.get("bound") is None
    document = rendered(result)
    assert document["verdict"]["bound"] is None and document["verdict"]["reason"]
    assert document["verdict"]["saving_ms"] is None and document["verdict"]["fix"] is None
    assert document["steps_used"] == result.steps_used < 3


def test_a_run_directory_and_a_memory_trace_summarise(tmp_path):
    run = make_run(
        tmp_path / "run",
        [step_line(i) for i in range(6)],
        host_rows=[[1700000000.0 + i * 0.1, 50.0, 90.0, 2e9] for i in range(8)],
    )
    document = rendered(analysis.analyze(run))
    assert document["step_source"] == "steps_csv" and document["utilization"]["host_mem_peak_bytes"] == 2e9
    memory = write_memory_trace(tmp_path / "plugins" / "profile" / "s" / "memory-host.xplane.pb")
    document = rendered(analysis.analyze(memory.path))
    top = document["memory"]["allocators"][0]
    assert top["name"] == "GPU_0_bfc" and top["peak_bytes"] == memory.peak_bytes
    assert top["peak_op"] == memory.peak_op and top["peak_step"] == memory.peak_step


def test_analyze_prints_and_writes_the_summary(cpu, capsys, tmp_path):
    assert cli.main(["analyze", str(cpu.path), "--format", "summary"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == json.loads(cpu.render("summary"))
    target = tmp_path / "summary.json"  # .json asks for the full document unless --format says otherwise
    assert cli.main(["analyze", str(cpu.path), "--format", "summary", "-o", str(target)]) == 0
    assert json.loads(target.read_text())["schema"] == "devprof.summary/1"


# ---------------------------------------------------------------- the bound, on a hostile analysis

BIG = -1.2345678901234567e300  # the longest number JSON writes
HUGE = -(2**62) - 12345  # the longest count


def _long(i: int, piece: str, n: int = 5000) -> str:
    return (f"scope_{i}/" + piece * n)[:n]


def hostile(base, piece: str, oom: bool = False):
    """`base` with every list hundreds long, every string 5,000 characters of `piece`, every number at its
    longest: as large an analysis as the summary can be given (with an out-of-memory error where `oom`)."""
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    many = range(500)
    fields.update(
        path=Path("/" + _long(0, piece)),
        device=_long(1, piece),
        step_source=_long(2, piece),
        step_name=_long(3, piece),
        steps_used=HUGE,
        notes=tuple(_long(i, piece) for i in range(300)),
        mean={f"{key}": BIG for key in ("step_ms", "input_pct", "compute_pct", "host_pct", "collective_pct")},
        verdict={
            key: _long(i, piece)
            for i, key in enumerate(
                ("bound", "level", "rule", "cause", "saving_basis", "evidence", "xprof_reading", "reason")
            )
        }
        | {
            "saving_ms": BIG,
            "saving_pct": BIG,
            "bound_pct": BIG,
            "advice": [_long(9, piece)] * 50,
            "fixes": [
                {
                    "rule": _long(i, piece),
                    "advice": _long(i, piece),
                    "saving_ms": BIG,
                    "saving_pct": BIG,
                    "saving_basis": _long(i, piece),
                }
                for i in many
            ],
        },
        findings=[
            {
                "rule": _long(i, piece),
                "severity": _long(i, piece),
                "evidence": _long(i, piece),
                "advice": _long(i, piece),
                "saving_ms": BIG,
                "saving_pct": BIG,
            }
            for i in many
        ],
        ops=pd.DataFrame(
            {
                **{
                    key: [_long(i, piece) for i in many]
                    for key in ("op", "type", "program", "device", "dtype", "bound")
                },
                "ms_per_step": BIG,
                "compute_pct": BIG,
                "ceiling_pct": BIG,
            }
        ),
        roofline={
            "mfu_pct": BIG,
            "dtype": _long(1, piece),
            "known_time_pct": BIG,
            "flops_per_step": BIG,
            "achieved_flops_per_second": BIG,
            "ceilings_source": _long(2, piece),
        },
        spread={
            "median_ms": BIG,
            "p90_ms": BIG,
            "outliers": [{"step": HUGE, "step_ms": BIG, "cause": _long(i, piece)} for i in range(1000)],
        },
        utilization={key: BIG for key in summary.UTILIZATION_KEYS},
        workers=pd.DataFrame({"worker": range(300)}),
        straggler_reason=_long(4, piece),
        straggler={"worker": _long(1, piece), "cause": _long(2, piece), "evidence": _long(3, piece)},
    )
    peak = AllocatorPeak(
        name=_long(1, piece),
        peak_bytes=HUGE,
        peak_time_ms=BIG,
        peak_step=HUGE,
        peak_op=_long(2, piece),
        capacity_bytes=HUGE,
        capacity_source=_long(3, piece),
        fragmentation=BIG,
        batch_bytes=BIG,
        fixed_bytes=BIG,
        max_batch=HUGE,
        headroom=_long(4, piece),
        headroom_basis=None,
        top_at_peak=(),
        by_op=(),
        by_region=(),
        events=1,
        growth_bytes_per_step=BIG,
    )
    failure = OomAtFailure(
        bytes=HUGE,
        shape=(HUGE,) * 100,
        dtype=_long(5, piece),
        op=_long(6, piece),
        allocator=_long(7, piece),
        device=_long(8, piece),
        time_s=BIG,
        source=_long(9, piece),
        held_allocator=_long(10, piece),
        held_bytes=HUGE,
        capacity_bytes=HUGE,
        before_failure_ms=BIG,
        top=(Live(_long(11, piece), _long(12, piece), _long(13, piece), _long(14, piece), HUGE, HUGE),) * 100,
        sampled=((_long(15, piece), _long(16, piece), HUGE, HUGE),) * 100,
    )
    workers = tuple(WorkerMemory(_long(i, piece), (peak,) * 200, pd.DataFrame()) for i in range(300))
    fields["memory"] = MemoryReport(
        allocators=(peak,) * 200,
        timeline=pd.DataFrame(),
        steps=pd.DataFrame(),
        sampled=(),
        batch_size=HUGE,
        oom=failure if oom else None,
        workers=workers,
    )
    return types.SimpleNamespace(**fields, input_bottleneck={"stage": _long(5, piece), "ms_per_batch": BIG})


@pytest.mark.parametrize("oom", [False, True], ids=["", "oom"])
@pytest.mark.parametrize("piece", ["abcde", 'é😀"\\\x01/'], ids=["ascii", "escapes-and-multibyte"])
def test_the_summary_stays_under_8_kb_on_a_hostile_analysis(cpu, piece, oom):
    text = summary.render_analysis(hostile(cpu, piece, oom))
    assert len(text.encode("utf-8")) <= summary.MAX_BYTES
    document = json.loads(text)
    assert len(document["findings"]) == summary.TOP_FINDINGS and len(document["ops"]) == summary.TOP_OPS
    assert len(document["verdict"]["fixes"]) == summary.TOP_FIXES
    assert document["findings_total"] == 500 and document["ops_total"] == 500 and document["notes_total"] == 300
    assert document["memory"]["fullest_worker"]["peak_bytes"] == summary.count(HUGE)
    assert document["spread"]["outliers"] == 1000 and document["memory"]["allocators_total"] == 200
    assert document["workers"]["count"] == 300


def test_strings_are_cut_to_their_byte_budget_keeping_what_tells_them_apart():
    sentence = "First part. " + "x" * 400
    cut = summary.text(sentence, 60)
    assert cut is not None
    assert len(json.dumps(cut, ensure_ascii=False).encode()) <= 60 and cut.endswith("…")
    headline = summary.text("Headline sentence here. Then the numbers go on and on" * 5, 80)
    assert headline is not None
    assert headline.startswith("Headline sentence here. ")
    name = "gradient_tape/model/conv2d_3/" + "a" * 300 + "/Conv2DBackpropFilter"
    short = summary.text(name, 48, middle=True)
    assert short is not None
    assert short.startswith("gradient_tape") and short.endswith("Filter") and "…" in short
    assert summary.text("é" * 100, 21) == "é" * 8 + "…"  # 2 bytes each, the quotes and the cut mark
    assert summary.text("", 20) is None and summary.text(float("nan"), 20) is None
    assert summary.number(float("inf")) is None and summary.number(74.52549) == 74.53
    assert summary.count(2.0**70) is None and summary.count(True) is None
