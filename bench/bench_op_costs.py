"""What recording op_costs.csv adds to a run: the seed CNN at batch 128 on this machine.

The same `devprof run` (synthetic data, one epoch, a 5-step window, no samplers) runs in this
process with op costs recorded and without (`Session._record_op_costs` a no-op), in turns, so
that both see the same machine; each run's wall time (`cli.main`, the whole run) and its
run.json `profiler.op_costs_seconds` are printed, and the medians compared.

    .venv/bin/python bench/bench_op_costs.py [--rounds 3] [--images 2560] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock


def one_run(out: Path, name: str, images: int, record: bool) -> tuple[float, dict]:
    from profiler import cli
    from profiler.record import session

    no_op_costs = mock.patch.object(session.Session, "_record_op_costs", lambda self: None)
    with contextlib.nullcontext() if record else no_op_costs:
        gc.collect()  # the graphs of the runs before this one are let go, as in a fresh process
        began = time.perf_counter()
        rc = cli.main(
            [
                "run",
                "--device",
                "cpu",
                "--data",
                "synthetic",
                "--out",
                str(out),
                "--run-name",
                name,
                "--quiet",
                "--epochs",
                "1",
                "--limit-images",
                str(images),
                "--batch-size",
                "128",
                "--no-sample",
                "--profile-steps",
                "5:10",
                "--limit-test-images",
                "256",
            ]
        )
        elapsed = time.perf_counter() - began
    if rc != 0:
        raise SystemExit(f"devprof run failed ({rc})")
    return elapsed, json.loads((out / name / "run.json").read_text())["profiler"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=2560, help="training images (batch 128: images/128 steps)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="devprof-bench-op-costs-"))
    one_run(out, "warm-up", 1280, True)  # imports and first traces, paid by neither side
    with_costs: list[float] = []
    without: list[float] = []
    collection: list[float] = []
    ops: list[int] = []
    for index in range(args.rounds):
        for record in (True, False) if index % 2 == 0 else (False, True):
            seconds, notes = one_run(out, f"{'with' if record else 'without'}-{index}", args.images, record)
            (with_costs if record else without).append(seconds)
            if record:
                collection.append(notes["op_costs_seconds"])
                ops.append(notes["op_costs_ops"])
            print(
                f"round {index} {'with   ' if record else 'without'} op costs: run {seconds:6.2f} s"
                + (f", collection {notes['op_costs_seconds']:.3f} s ({notes['op_costs_ops']} ops)" if record else "")
            )
    w, wo, c = statistics.median(with_costs), statistics.median(without), statistics.median(collection)
    print(
        f"median run: with {w:.2f} s, without {wo:.2f} s, ratio {w / wo:.3f}; "
        f"collection {c:.3f} s = {100 * c / wo:.1f} % of a run without it; {ops[-1]} ops recorded"
    )


if __name__ == "__main__":
    main()
