"""The summary for agents (`--format summary`, schema `devprof.summary/1`, docs/json.md and
docs/summary.schema.json): the verdict and its saving, the findings ranked, the top ops with their
roofline share, the spread, memory (an out-of-memory error that ended the run included) and utilization
headlines, in at most `MAX_BYTES`.

Bounded by construction, never by cutting the document afterwards: at most `TOP_*` items of each
list, every string cut to a byte budget as JSON encodes it (UTF-8, escapes included), every number
rounded, every key always present (null where unknown). The budgets add up to less than
`MAX_BYTES` with every string and number at its longest (tests/test_summary.py builds such an
analysis).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from analysis.render.names import ELLIPSIS, distinct_names, middle_cut

SCHEMA = "devprof.summary/1"
MAX_BYTES = 8192

TOP_FINDINGS = 5
TOP_OPS = 6
TOP_OUTLIERS = 3
TOP_ALLOCATORS = 2  # 1 where the run ended out of memory: `oom` takes the other's room
TOP_OOM_HELD = 1  # the largest group live when the allocation failed (the full JSON lists more)
TOP_NOTES = 2

# Byte budgets of strings, quotes included.
WORD = 20  # a word from a short list: severity, level, bound, cause, dtype
ID = 32  # a rule's id (the longest, `bf16_without_matrix_units`, takes 27)
LABEL = 24  # an op's type, program and device
NAME = 48  # op, allocator, stage, step and worker names
PATH = 100
SENTENCE = 150
BASIS = 100  # the verdict's saving basis: its start says what was assumed; the analysis JSON has all of it
EVIDENCE = 280  # the verdict's headline and numbers
FIX = 240  # the verdict's first advice: its cause's fix
FINDING_TEXT = 128
LONGEST_NAME = 1024  # characters of an op's name that distinct_names looks at

UTILIZATION_KEYS = (
    "cpu_util_mean_pct",
    "proc_cpu_mean_pct",
    "other_cpu_mean_pct",
    "device_util_mean_pct",
    "host_mem_peak_bytes",
    "device_mem_peak_bytes",
    "device_mem_total_bytes",
)
PARTS = ("input", "compute", "host", "collective")


def _given(value):
    """`value`, or None for what is not there: None, NaN, pandas' NA, an empty string."""
    try:
        if value is None or bool(pd.isna(value)) or value == "":
            return None
    except (TypeError, ValueError):  # not a scalar
        pass
    return value


def _encoded(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8"))


def text(value, limit: int, middle: bool = False) -> str | None:
    """`value` as a string whose JSON form takes at most `limit` bytes: a sentence cut at its end (after
    its last whole sentence that fits, where that keeps half the budget), a name or path in its middle;
    the cut marked `…`."""
    value = _given(value)
    if value is None:
        return None
    whole = str(value).encode("utf-8", "replace").decode("utf-8")  # a path's undecodable bytes: `?`
    if _encoded(whole) <= limit:
        return whole

    def cut(chars: int) -> str:
        if middle:
            return middle_cut(whole, chars)
        head = whole[: chars - 1]
        stop = head.rfind(". ")
        return (head[: stop + 2] if stop >= chars // 2 else head) + ELLIPSIS

    # The longest cut that fits: characters take 1 to 6 bytes each (escapes), so search.
    best, low, high = None, 2, limit - 2
    while low <= high:
        middle_chars = (low + high) // 2
        candidate = cut(middle_chars)
        if _encoded(candidate) <= limit:
            best, low = candidate, middle_chars + 1
        else:
            high = middle_chars - 1
    if best is not None:
        return best
    return ELLIPSIS if _encoded(ELLIPSIS) <= limit else ""


def _finite(value) -> float | None:
    """`value` as a finite float; None for what is missing, a bool, not a number or not finite."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def number(value, significant: int = 4) -> float | None:
    """A finite number to `significant` digits (at most 11 characters as JSON); None for what is
    missing or not finite."""
    value = _finite(value)
    return float(f"{value:.{significant}g}") if value is not None else None


def count(value) -> int | None:
    """A whole number of things (bytes, steps); None where missing, not finite or beyond int64."""
    value = _finite(value)
    return int(value) if value is not None and abs(value) < 2**63 else None


TOP_FIXES = 3  # the verdict's fixes in the summary, largest first (the analysis JSON has all)


def _verdict(verdict: dict) -> dict:
    advice = verdict.get("advice") or []
    return {
        "bound": text(verdict.get("bound"), WORD),
        "bound_pct": number(verdict.get("bound_pct")),
        "level": text(verdict.get("level"), WORD),
        "rule": text(verdict.get("rule"), ID),
        "cause": text(verdict.get("cause"), ID),
        "saving_ms": number(verdict.get("saving_ms")),
        "saving_pct": number(verdict.get("saving_pct")),
        "saving_basis": text(verdict.get("saving_basis"), BASIS),
        "evidence": text(verdict.get("evidence"), EVIDENCE),
        "fix": text(advice[0], FIX) if advice else None,
        "fixes": [
            {
                "rule": text(fix.get("rule"), ID),
                "saving_ms": number(fix.get("saving_ms")),
                "saving_pct": number(fix.get("saving_pct")),
            }
            for fix in (verdict.get("fixes") or [])[:TOP_FIXES]
        ],
        "xprof_reading": text(verdict.get("xprof_reading"), SENTENCE),
        "reason": text(verdict.get("reason"), SENTENCE),
    }


def _findings(findings: list[dict]) -> list[dict]:
    return [
        {
            "rule": text(item.get("rule"), ID),
            "severity": text(item.get("severity"), WORD),
            "saving_ms": number(item.get("saving_ms")),
            "saving_pct": number(item.get("saving_pct")),
            "evidence": text(item.get("evidence"), FINDING_TEXT),
            "fix": text(item.get("advice"), FINDING_TEXT),
        }
        for item in findings[:TOP_FINDINGS]
    ]


def _ops(ops) -> list[dict]:
    top = ops.head(TOP_OPS)
    if top.empty:
        return []
    # distinct_names' time grows fast with a name's parts: a name of thousands of them is cut first.
    names = distinct_names([middle_cut(str(name), LONGEST_NAME) for name in top["op"]], NAME - 2)

    def column(key):
        return top[key].tolist() if key in top else [None] * len(top)

    return [
        {
            "op": text(name, NAME, middle=True),
            "type": text(kind, LABEL, middle=True),
            "program": text(program, LABEL, middle=True),
            "device": text(device, LABEL, middle=True),
            "dtype": text(dtype, WORD),
            "ms_per_step": number(ms),
            "compute_pct": number(pct),
            "ceiling_pct": number(ceiling),
            "bound": text(bound, WORD),
        }
        for name, kind, program, device, dtype, ms, pct, ceiling, bound in zip(
            names,
            column("type"),
            column("program"),
            column("device"),
            column("dtype"),
            column("ms_per_step"),
            column("compute_pct"),
            column("ceiling_pct"),
            column("bound"),
        )
    ]


def _roofline(roofline: dict | None) -> dict | None:
    if not roofline:
        return None
    return {
        "mfu_pct": number(roofline.get("mfu_pct")),
        "dtype": text(roofline.get("dtype"), WORD),
        "known_time_pct": number(roofline.get("known_time_pct")),
        "flops_per_step": number(roofline.get("flops_per_step")),
        "achieved_flops_per_second": number(roofline.get("achieved_flops_per_second")),
        "ceilings_source": text(roofline.get("ceilings_source"), NAME),
    }


def _spread(spread: dict | None) -> dict | None:
    if not spread:
        return None
    outliers = spread.get("outliers") or []
    return {
        "median_ms": number(spread.get("median_ms")),
        "p90_ms": number(spread.get("p90_ms")),
        "outliers": len(outliers),
        "slowest": [
            {
                "step": count(item.get("step")),
                "step_ms": number(item.get("step_ms")),
                "cause": text(item.get("cause"), WORD),
            }
            for item in outliers[:TOP_OUTLIERS]
        ],
    }


def _oom(failure) -> dict | None:
    """The allocation that ended the run and what held the memory then: the allocator and its largest
    live groups from the trace, else the sampler of the failing device (the host's otherwise)."""
    if failure is None:
        return None
    held_by, held, capacity = failure.held_allocator, failure.held_bytes, failure.capacity_bytes
    if failure.source == "samplers" and failure.sampled:
        gpu = (failure.allocator or "").startswith("GPU_") or "GPU" in (failure.device or "")
        sampler, _, held, capacity = next(
            (s for s in failure.sampled if s[0].startswith("gpu") == gpu), failure.sampled[0]
        )
        held_by = sampler
    return {
        "bytes": count(failure.bytes),
        "op": text(failure.op, NAME, middle=True),
        "allocator": text(failure.allocator, LABEL, middle=True),
        "source": text(failure.source, WORD),
        "held_by": text(held_by, LABEL, middle=True),
        "held_bytes": count(held),
        "capacity_bytes": count(capacity),
        "top": [
            {"op": text(live.op, NAME, middle=True), "bytes": count(live.bytes)} for live in failure.top[:TOP_OOM_HELD]
        ],
    }


def _memory(memory) -> dict | None:
    if memory is None:
        return None
    allocators = list(memory.allocators)
    shown = TOP_ALLOCATORS - (memory.oom is not None)
    return {
        "allocators": [
            {
                "name": text(a.name, NAME, middle=True),
                "peak_bytes": count(a.peak_bytes),
                "capacity_bytes": count(a.capacity_bytes),
                "peak_step": count(a.peak_step),
                "peak_op": text(a.peak_op, NAME, middle=True),
                "max_batch": count(a.max_batch),
            }
            for a in allocators[:shown]
        ],
        "allocators_total": len(allocators),
        "batch_size": count(memory.batch_size),
        "oom": _oom(memory.oom),
        "fullest_worker": _fullest_worker(memory.workers),
    }


def _fullest_worker(workers) -> dict | None:
    """Of a job's workers, the allocator nearest its capacity (the largest peak where none states one)."""
    held = [(worker, peak) for worker in workers for peak in worker.allocators]
    if not held:
        return None
    worker, peak = max(
        held, key=lambda item: (item[1].capacity_share if item[1].capacity_bytes > 0 else -1.0, item[1].peak_bytes)
    )
    name = worker.worker if isinstance(worker.worker, int) else text(worker.worker, LABEL, middle=True)
    return {
        "worker": name,
        "allocator": text(peak.name, LABEL, middle=True),
        "peak_bytes": count(peak.peak_bytes),
        "capacity_bytes": count(peak.capacity_bytes),
    }


def _workers(analysis) -> dict | None:
    workers = analysis.workers
    if workers is None or workers.empty:
        return None
    straggler = analysis.straggler
    return {
        "count": len(workers),
        "straggler": None
        if not straggler
        else {"worker": text(straggler.get("worker"), NAME, middle=True), "cause": text(straggler.get("cause"), WORD)},
        "reason": text(analysis.straggler_reason, SENTENCE),
    }


def _input_bottleneck(bottleneck: dict | None) -> dict | None:
    if not bottleneck:
        return None
    return {
        "stage": text(bottleneck.get("stage"), NAME, middle=True),
        "ms_per_batch": number(bottleneck.get("ms_per_batch")),
    }


def summary_document(analysis) -> dict:
    mean = analysis.mean
    notes = list(analysis.notes)
    return {
        "schema": SCHEMA,
        "source": text(analysis.path, PATH, middle=True),
        "device": text(analysis.device, LABEL, middle=True),
        "step_source": text(analysis.step_source, WORD),
        "step_name": text(analysis.step_name, NAME, middle=True),
        "steps_used": count(analysis.steps_used),
        "step_ms": number(mean.get("step_ms")),
        "parts_pct": {part: number(mean.get(f"{part}_pct")) for part in PARTS},
        "verdict": _verdict(analysis.verdict),
        "findings": _findings(list(analysis.findings)),
        "findings_total": len(analysis.findings),
        "ops": _ops(analysis.ops),
        "ops_total": len(analysis.ops),
        "roofline": _roofline(analysis.roofline),
        "spread": _spread(analysis.spread),
        "input_bottleneck": _input_bottleneck(analysis.input_bottleneck),
        "memory": _memory(analysis.memory),
        "utilization": {
            key: count(analysis.utilization.get(key))
            if key.endswith("_bytes")
            else number(analysis.utilization.get(key))
            for key in UTILIZATION_KEYS
        },
        "workers": _workers(analysis),
        "notes": [text(note, SENTENCE) for note in notes[:TOP_NOTES]],
        "notes_total": len(notes),
    }


def dumps(document: dict) -> str:
    """The document as one line of compact JSON (UTF-8 as it is, not `\\u` escapes: fewer bytes)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def render_analysis(analysis) -> str:
    return dumps(summary_document(analysis)) + "\n"
