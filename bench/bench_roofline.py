"""What the roofline adds to `devprof analyze`: the same trace analysed with and without op costs.

Writes a CPU trace of `--steps` steps, each running `--ops` distinct TensorFlow ops on a compute
thread (the size of a large model's step: the seed CNN's train step runs about 150), and a cost
table naming every op as `op_costs.csv` would (two traced functions, so the choice between them
is exercised). Then times, alternating and repeated, `analyze_inputs` of the one decoded trace
without costs (no roofline work) and with costs and ceilings. Prints per-repeat times, medians
and the ratio. Usage:

    python bench/bench_roofline.py [--steps 200] [--ops 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))

BASE_NS = 1_700_000_000_000_000_000
NS_PER_US = 1_000


def write_trace(path: Path, steps: int, ops: int) -> Path:
    from trace_fixtures import _Plane, _write_space, _xspace_class

    space = _xspace_class()()
    space.hostnames.append("bench-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", BASE_NS)
    worker = host.line(101, "tf_Compute/1", BASE_NS)
    step_ns = (ops * 20 + 200) * NS_PER_US
    for k in range(steps):
        t = BASE_NS + NS_PER_US * 1000 + k * step_ns
        host.event(python, "IteratorGetNext", t, t + 50 * NS_PER_US, group_id=k)
        host.event(python, "EagerExecute", t + 50 * NS_PER_US, t + step_ns - 50 * NS_PER_US, group_id=k)
        at = t + 100 * NS_PER_US
        for i in range(ops):
            host.event(worker, f"model/layer_{i}/Conv2D:_MklConv2D", at, at + 19 * NS_PER_US, group_id=k)
            at += 20 * NS_PER_US
    host.finish()
    return _write_space(space, path)


def cost_table(ops: int):
    import pandas as pd

    rows = []
    for function, scale in (("train_step", 1.0), ("eval_step", 0.5)):
        for i in range(ops):
            rows.append(
                {
                    "function": function,
                    "op": f"model/layer_{i}/Conv2D",
                    "type": "Conv2D",
                    "dtype": "float32",
                    "kind": "matrix",
                    "input_shapes": "128x32x32x64;3x3x64x64",
                    "output_shapes": "128x32x32x64",
                    "flops": 2e9 * scale,
                    "bytes": 6e7 * scale,
                    "flops_source": "tensorflow",
                    "chain_flops": float("nan"),
                    "chain_bytes": float("nan"),
                }
            )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    from analysis.breakdown import roofline
    from analysis.read.inputs import read_inputs
    from analysis.worker import analyze_inputs

    ceilings = roofline.Ceilings(
        {
            "float32": {
                "matrix_flops_per_second": 2e11,
                "vector_flops_per_second": 5e10,
                "memory_bytes_per_second": 4e10,
            }
        },
        "bench",
    )
    with tempfile.TemporaryDirectory(prefix="devprof-bench-") as tmp:
        xplane = write_trace(Path(tmp) / "bench.xplane.pb", args.steps, args.ops)
        inputs = read_inputs(xplane)
        with_costs = dataclasses.replace(inputs, op_costs=cost_table(args.ops))
        assert inputs.trace is not None  # read_inputs reads the trace unless told trace=False
        events = len(inputs.trace.events)

        def timed(run_inputs, peak) -> float:
            start = time.perf_counter()
            analyze_inputs(run_inputs, peak=peak)
            return time.perf_counter() - start

        timed(inputs, None), timed(with_costs, ceilings)  # warm
        plain, roof = [], []
        for _ in range(args.repeats):
            plain.append(timed(inputs, None))
            roof.append(timed(with_costs, ceilings))
    print(f"trace: {args.steps} steps x {args.ops} ops = {events:,} events; cost table {2 * args.ops} rows")
    print("analysis without costs (s):", " ".join(f"{t:.3f}" for t in plain))
    print("analysis with roofline (s):", " ".join(f"{t:.3f}" for t in roof))
    a, b = statistics.median(plain), statistics.median(roof)
    print(f"median: {a:.3f} s without, {b:.3f} s with: the roofline adds {b - a:.3f} s ({100 * (b - a) / a:+.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
