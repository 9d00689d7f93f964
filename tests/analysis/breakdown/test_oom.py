"""An out-of-memory error that ends a run: TensorFlow's message read into run.json `oom`, and `analyze`
saying what held the memory then, from the trace where its window covered the failure, else from the
samplers. No TensorFlow: the messages are TensorFlow 2.x's own texts."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from memory_fixtures import GPU, MS, MiB, write_memory_trace
from profiler.record.oom import is_oom, oom_record, parse_oom
from trace_fixtures import ABSOLUTE_BASE_NS

# TF 2.4-2.8 graph mode (Keras fit on a GPU)
GRAPH_GPU = (
    "2 root error(s) found.\n  (0) Resource exhausted:  OOM when allocating tensor with shape[256,64,112,112] "
    "and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n"
    "\t [[node model/conv1/Conv2D (defined at train.py:42) ]]\nHint: If you want to see a list of allocated "
    "tensors when OOM happens, add report_tensor_allocations_upon_oom to RunOptions for current allocation "
    "info.\n\n  (1) Resource exhausted: ..."
)
# TF 2.9+ graph mode: the node named twice, the tf.function as [Op:...]
GRAPH_NODE = (
    "Graph execution error:\n\nDetected at node 'model/conv2d/Conv2D' defined at (most recent call last):\n"
    "    File \"train.py\", line 10, in <module>\n      model.fit(x, y)\nNode: 'model/conv2d/Conv2D'\n"
    "OOM when allocating tensor with shape[128,64,224,224] and type half on "
    "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n\t [[{{node model/conv2d/Conv2D}}]]\n"
    "Hint: If you want to see a list of allocated tensors when OOM happens, add "
    "report_tensor_allocations_upon_oom to RunOptions for current allocation info. This isn't available "
    "when running in Eager mode.\n [Op:__inference_train_function_1234]"
)
# TF 2.11+ eager on the CPU (this TensorFlow's own text for tf.zeros([2**20, 2**20, 64]))
EAGER_CPU = (
    "{{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:CPU:0}} OOM when "
    "allocating tensor with shape[1048576,1048576,64] and type float on "
    "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu [Op:Fill] name: "
)
# TF 2.3 eager on a GPU
EAGER_GPU = (
    "OOM when allocating tensor with shape[100000,100000] and type float on "
    "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:RandomUniform]"
)


@pytest.mark.parametrize(
    "message, expected",
    [
        (
            GRAPH_GPU,
            {
                "bytes": 256 * 64 * 112 * 112 * 4,
                "shape": [256, 64, 112, 112],
                "dtype": "float",
                "op": "model/conv1/Conv2D",
                "allocator": GPU,
                "device": "/job:localhost/replica:0/task:0/device:GPU:0",
            },
        ),
        (
            GRAPH_NODE,
            {
                "bytes": 128 * 64 * 224 * 224 * 2,
                "shape": [128, 64, 224, 224],
                "dtype": "half",
                "op": "model/conv2d/Conv2D",
                "allocator": GPU,
                "device": "/job:localhost/replica:0/task:0/device:GPU:0",
            },
        ),
        (
            EAGER_CPU,
            {
                "bytes": 2**46 * 4,
                "shape": [2**20, 2**20, 64],
                "dtype": "float",
                "op": "Fill",
                "allocator": "mklcpu",
                "device": "/job:localhost/replica:0/task:0/device:CPU:0",
            },
        ),
        (
            EAGER_GPU,
            {
                "bytes": 10**10 * 4,
                "shape": [100000, 100000],
                "dtype": "float",
                "op": "RandomUniform",
                "allocator": GPU,
                "device": "/job:localhost/replica:0/task:0/device:GPU:0",
            },
        ),
        # XLA states bytes only; the rest is null, not made up
        (
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes.",
            {"bytes": 8589934592, "shape": None, "dtype": None, "op": None, "allocator": None, "device": None},
        ),
        # a type without a width (string): no bytes
        (
            "OOM when allocating tensor with shape[10] and type string on /job:localhost/replica:0/task:0/device:CPU:0 "
            "by allocator cpu [Op:Fill]",
            {
                "bytes": None,
                "shape": [10],
                "dtype": "string",
                "op": "Fill",
                "allocator": "cpu",
                "device": "/job:localhost/replica:0/task:0/device:CPU:0",
            },
        ),
    ],
)
def test_tensorflows_oom_messages_give_the_allocation_that_failed(message, expected):
    assert parse_oom(message) == expected


def test_only_resource_exhausted_errors_are_ooms():
    class ResourceExhaustedError(Exception):  # TensorFlow's class, by name
        pass

    class Subclass(ResourceExhaustedError):
        pass

    assert is_oom(ResourceExhaustedError(EAGER_CPU)) and is_oom(Subclass(EAGER_GPU))
    assert not is_oom(ValueError(EAGER_CPU)) and oom_record(ValueError(EAGER_CPU)) is None
    record = oom_record(ResourceExhaustedError(EAGER_GPU), at_s=12.5)
    assert record is not None
    assert record["op"] == "RandomUniform" and record["time_s"] == 12.5
    # a message that says nothing usable still records that memory ran out
    assert oom_record(ResourceExhaustedError("out of budget"), at_s=1.0) == {
        "bytes": None,
        "shape": None,
        "dtype": None,
        "op": None,
        "allocator": None,
        "device": None,
        "time_s": 1.0,
    }


def test_a_failed_run_records_its_oom_in_run_json(tmp_path):
    from profiler.record.session import Session

    class ResourceExhaustedError(Exception):
        pass

    session = Session.__new__(Session)
    session.meta, session.stopped_by = {"status": "running"}, None
    session._mark_ended(ResourceExhaustedError(GRAPH_GPU))
    assert session.meta["status"] == "failed" and session.meta["error"].startswith("ResourceExhaustedError: ")
    assert session.meta["oom"]["op"] == "model/conv1/Conv2D" and session.meta["oom"]["allocator"] == GPU
    json.dumps(session.meta)
    other = Session.__new__(Session)
    other.meta, other.stopped_by = {"status": "running"}, None
    other._mark_ended(RuntimeError("boom"))
    assert "oom" not in other.meta


# ---------------------------------------------------------------- analyze

OOM_OP = "gradient_tape/conv/Conv2DBackpropInput"


def _failed_run(root, *, at_ns: int, trace: bool = True):
    """A run that failed with an OOM at `at_ns`: the memory trace (batch 8, three steps from base + 10 ms),
    steps.csv and a host and a GPU sampler over the run."""
    run = root / "run"
    run.mkdir(parents=True)
    if trace:
        write_memory_trace(run / "plugins" / "profile" / "s" / "memory-host.xplane.pb")
    oom = parse_oom(GRAPH_NODE.replace("model/conv2d/Conv2D", OOM_OP))
    assert oom is not None
    (run / "run.json").write_text(
        json.dumps(
            {
                "status": "failed",
                "error": "ResourceExhaustedError: " + GRAPH_NODE,
                "oom": {**oom, "time_s": at_ns / 1e9},
                "config": {"batch_size": 8, "precision": "float32"},
                "device": {"kind": "gpu", "name": "Test GPU", "gpus": [{"name": "Test GPU", "memory_bytes": 16 * MiB}]},
                "steps_per_epoch": 3,
                "epochs": [],
            }
        )
    )
    start = ABSOLUTE_BASE_NS / 1e9
    rows = [f"0,{k},1,{start + 0.01 * (k + 1):.6f},1.0,8.0,1.0,10.0,8" for k in range(3)]
    (run / "steps.csv").write_text(
        "epoch,step,steps,start_time_s,input_ms,call_ms,other_host_ms,step_ms,images\n" + "\n".join(rows) + "\n"
    )
    (run / "utilization").mkdir()
    times = start + np.arange(0.0, 20.0, 0.5)
    pd.DataFrame(
        {
            "time_s": times,
            "cpu_pct": 50.0,
            "proc_rss_bytes": np.where(times < start + 12, 2e9, 3e9),
            "mem_used_bytes": 4e9,
            "mem_available_bytes": 4e9,
        }
    ).to_csv(run / "utilization" / "host.csv", index=False)
    pd.DataFrame(
        {
            "time_s": times,
            "mem_used_bytes": np.where(times < start + 12, 10 * MiB, 15 * MiB),
            "mem_total_bytes": 16 * MiB,
        }
    ).to_csv(run / "utilization" / "gpu0.csv", index=False)
    return run


def _oom_finding(run):
    from analysis import analyze

    result = analyze(run)
    found = [f for f in result.findings if f["rule"] == "memory_oom"]
    assert len(found) == 1
    return result, found[0]


def _text_memory(result) -> list[str]:
    """The text report's memory lines, from its heading on."""
    lines = result.render("text").splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("memory")) :]


def _html_oom(result) -> str:
    """The HTML report's out-of-memory box, inside its memory section."""
    import html as markup

    from analysis.render import html

    page = html.render_analysis(result)
    section = page[page.index('id="memory"') :]
    box = section[section.index('<div class="oom">') : section.index("</section>")]
    end = box.find("<h3>", len('<div class="oom"><h3>'))  # the next allocator's heading
    return markup.unescape(box[:end] if end > 0 else box)


def _summary_oom(result) -> dict:
    """The summary's `memory.oom`, the summary valid against its schema."""
    from summary_checks import rendered

    document = rendered(result)
    assert len(document["memory"]["allocators"]) == 1  # the oom takes the second one's room
    return document["memory"]["oom"]


def test_an_oom_inside_the_traced_window_is_told_from_the_trace(tmp_path):
    # step 1 starts at base + 20 ms; its Conv2DBackpropInput allocation (+5) reaches the peak; the
    # failure half a millisecond later, before the frees at +6
    run = _failed_run(tmp_path, at_ns=ABSOLUTE_BASE_NS + 25 * MS + MS // 2)
    result, finding = _oom_finding(run)
    size = 128 * 64 * 224 * 224 * 2
    assert finding["severity"] == "critical" and finding["saving_ms"] is None
    assert finding["evidence"].startswith(
        f"The run ran out of memory allocating 784.0 MiB ({size:,} bytes) for a [128,64,224,224] half tensor in "
        f"{OOM_OP} on GPU_0_bfc. GPU_0_bfc held 11.0 MiB of its 16.0 MiB then (the trace's last event, 0.5 ms "
        "before the failure): 4.0 MiB allocated before the traced window; 3.0 MiB extra/Fill [786432] float; "
        "2.0 MiB "
    )
    assert "--batch-size N" in finding["advice"] and "cuda_malloc_async" in finding["advice"]
    document = result.to_json()["memory"]["oom"]
    assert document["source"] == "trace" and document["bytes"] == size and document["op"] == OOM_OP
    assert document["held_allocator"] == GPU and document["held_bytes"] == 11 * MiB + 512
    assert document["capacity_bytes"] == 16 * MiB
    holders = {(h["op"], h["bytes"]) for h in document["top_at_failure"]}
    assert holders == {
        (None, 4 * MiB),
        ("extra/Fill", 3 * MiB),
        ("model/conv/Conv2D", 2 * MiB),
        (OOM_OP, 2 * MiB),
        ("model/dense/MatMul", 512),
    }
    json.dumps(result.to_json())
    # Every report says it in its memory part, not only in the finding.
    failed = f"784.0 MiB ({size:,} bytes) for a [128,64,224,224] half tensor in {OOM_OP} on GPU_0_bfc"
    memory = _text_memory(result)
    assert memory[1] == f"  out of memory, which ended the run: allocating {failed}"
    assert (
        memory[2]
        == "    held then: GPU_0_bfc 11.0 MiB of its 16.0 MiB (its last traced event, 0.5 ms before the failure)"
    )
    assert memory[3].startswith("    live then: 4.0 MiB allocated before the traced window; 3.0 MiB extra/Fill")
    box = _html_oom(result)
    assert f"The run failed allocating {failed}." in box and "Held then: GPU_0_bfc 11.0 MiB of its 16.0 MiB" in box
    assert "extra/<wbr>Fill" in box and '<td class="n">27.3</td>' in box  # 3 of the 11 MiB held
    assert _summary_oom(result) == {
        "bytes": size,
        "op": OOM_OP,
        "allocator": GPU,
        "source": "trace",
        "held_by": GPU,
        "held_bytes": 11 * MiB + 512,
        "capacity_bytes": 16 * MiB,
        "top": [{"op": None, "bytes": 4 * MiB}],
    }


def test_an_oom_after_the_traced_window_is_told_from_the_samplers(tmp_path):
    # 15 s after the window: the trace says nothing of it; the samplers' last values before it do
    run = _failed_run(tmp_path, at_ns=ABSOLUTE_BASE_NS + 15 * 10**9)
    result, finding = _oom_finding(run)
    assert (
        "No allocator events were traced at the failure; the samplers' last values before it: process RSS (host) 2.79 GiB of 7.45 GiB; "
        "GPU memory used (gpu0) 15.0 MiB of 16.0 MiB." in finding["evidence"]
    )
    document = result.to_json()["memory"]["oom"]
    assert document["source"] == "samplers" and document["top_at_failure"] == []
    assert document["samplers"][1] == {
        "sampler": "gpu0",
        "what": "GPU memory used",
        "last_bytes": 15 * MiB,
        "total_bytes": 16 * MiB,
    }
    held = (
        "held then (no allocator event traced at the failure; each sampler's last value before it): process RSS "
        "(host) 2.79 GiB of 7.45 GiB; GPU memory used (gpu0) 15.0 MiB of 16.0 MiB"
    )
    memory = _text_memory(result)
    assert (
        memory[1].startswith("  out of memory, which ended the run: allocating 784.0 MiB")
        and memory[2] == f"    {held}"
    )
    assert "live then" not in memory[3]
    box = _html_oom(result)
    assert f"in {OOM_OP} on GPU_0_bfc." in box and f"H{held[1:]}." in box and "<table" not in box
    # The GPU's sampler: the allocation failed on a GPU.
    assert _summary_oom(result) | {"bytes": None} == {
        "bytes": None,
        "op": OOM_OP,
        "allocator": GPU,
        "source": "samplers",
        "held_by": "gpu0",
        "held_bytes": 15 * MiB,
        "capacity_bytes": 16 * MiB,
        "top": [],
    }


def test_an_oom_without_a_trace_is_told_from_the_samplers(tmp_path):
    run = _failed_run(tmp_path, at_ns=ABSOLUTE_BASE_NS + 5 * 10**9, trace=False)
    result, finding = _oom_finding(run)
    assert f"in {OOM_OP} on GPU_0_bfc. No allocator events were traced at the failure" in finding["evidence"]
    assert (
        "process RSS (host) 1.86 GiB of 7.45 GiB; GPU memory used (gpu0) 10.0 MiB of 16.0 MiB." in finding["evidence"]
    )


def test_a_run_that_did_not_run_out_of_memory_has_no_oom(tmp_path):
    run = _failed_run(tmp_path, at_ns=ABSOLUTE_BASE_NS + 25 * MS)
    meta = json.loads((run / "run.json").read_text())
    del meta["oom"]
    (run / "run.json").write_text(json.dumps(meta))
    from analysis import analyze

    result = analyze(run)
    assert not [f for f in result.findings if f["rule"] == "memory_oom"]
    assert result.to_json()["memory"]["oom"] is None
