"""What `profiler.profile()` costs a training loop outside the trace window.

A step here is a 10 ms busy wait (a deadline on `time.perf_counter`, so its own length does
not vary); the same loop runs bare and inside `profile()` (iterate + step + log every step,
the trace window after the last step), alternately, and the difference per step is the API's
cost: step markers, timing, the steps.csv row written and flushed, the scalars. Run with and
without the samplers (their threads share the machine's cores).

    .venv/bin/python bench/bench_api_overhead.py [--steps 300] [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

STEP_S = 0.010


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def bare(batches) -> float:
    began = time.perf_counter()
    for _ in batches:
        busy(STEP_S)
    return time.perf_counter() - began


def profiled(batches, out: str, name: str, sample: bool) -> float:
    import profiler

    with profiler.profile(
        out, run_name=name, profile_steps=f"{len(batches) + 10}:{len(batches) + 20}", sample=sample, quiet=True
    ) as session:
        began = time.perf_counter()
        for _ in session.iterate(batches):
            with session.step(images=32):
                busy(STEP_S)
            session.log(loss=1.0)
        elapsed = time.perf_counter() - began
    return elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import numpy as np
    import tensorflow as tf  # noqa: F401 - loaded before timing, as in any training program

    batches = [np.zeros((32, 8), "float32") for _ in range(args.steps)]
    out = args.out or tempfile.mkdtemp(prefix="devprof-bench-api-")
    profiled(batches[:20], out, "warm-up", False)  # first use: imports, TensorFlow's summary writer
    costs: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(args.rounds):
        for sample in (False, True):
            base = bare(batches)
            with_api = profiled(batches, out, f"r{round_}-{'sampled' if sample else 'api'}", sample)
            costs[sample].append((with_api - base) / args.steps)
    print(f"{args.steps} steps of {STEP_S * 1e3:.0f} ms, {args.rounds} rounds (median, min..max of the rounds)")
    for sample, label in ((False, "profile(sample=False)"), (True, "profile() with samplers")):
        values = costs[sample]
        median = statistics.median(values)
        print(
            f"{label:26s} {median * 1e6:7.1f} us/step = {median / STEP_S * 100:.2f} % of a 10 ms step "
            f"({min(values) * 1e6:.1f}..{max(values) * 1e6:.1f} us)"
        )


if __name__ == "__main__":
    main()
