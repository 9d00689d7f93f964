"""`devprof tune` on injected problems: which fix it keeps, the estimate beside the measured saving, and
the trials it took.

Each problem is the seed CNN (or a small `--model` with its own `--dataset`) on synthetic data with one
cost injected; `devprof tune` runs on it with `--budget`, in a fresh process, and its tune.json is read.

    python bench/bench_tune.py [--problems input_delay,host_delay,slow_map,tiny_batch] [--budget 7]

Problems:
- input_delay: `--batch-size 32 --inject-input-delay-ms 80` (a sleep in the CNN's pipeline, one batch
  at a time); expected fix: the pipeline's stages in parallel and prefetched.
- host_delay: `--batch-size 32 --inject-host-delay-ms 60` (a sleep in the training loop, every call);
  expected fix: several steps per call.
- slow_map: a `--model` whose `--dataset` maps each batch through 30 ms of waiting, with tf.data's own
  map parallelization and prefetch injection turned off (as an older TensorFlow, or a pipeline that
  turned them off, leaves it); expected fix: tf.data's AUTOTUNE (`--parallel-calls auto --prefetch auto`).
- tiny_batch: `--batch-size 4` (the step's fixed cost dominates); expected fix: several steps per call,
  or a larger batch.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SLOW_MAP_MODULE = """
import time

import numpy as np
import tensorflow as tf


def build():
    return tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                tf.keras.layers.Dense(10)])


def _slow(x):
    time.sleep(0.03)  # a read or a decode: a wait, however busy the machine is
    return x


def data():
    rng = np.random.default_rng(0)
    x, y = rng.random((64 * 32, 64), dtype=np.float32), rng.integers(0, 10, 64 * 32).astype("int32")
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.inject_prefetch = False
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    return batches.map(lambda x, y: (tf.numpy_function(_slow, [x], tf.float32, stateful=False), y)).with_options(
        options
    )
"""

# Batch 32, not the seed's 100: each injected cost is then the step's largest part (at 100 the CNN's
# 160 ms of compute dwarfs a 40 ms delay, and its XLA estimate ranks first).
PROBLEMS = {
    "input_delay": (["--batch-size", "32", "--inject-input-delay-ms", "80"], {"input_wait", "no_prefetch"}),
    "host_delay": (
        ["--batch-size", "32", "--inject-host-delay-ms", "60"],
        {"host_bound", "launch_bound", "host_sync"},
    ),
    "slow_map": (["--model", "{module}:build", "--dataset", "{module}:data"], {"input_wait", "no_prefetch"}),
    "tiny_batch": (["--batch-size", "4"], {"host_bound", "launch_bound", "host_sync", "below_roofline"}),
}


def tune(problem: str, out: Path, budget_min: float) -> tuple[dict, float, list[str]]:
    """One `devprof tune` of `problem`: its tune.json, wall seconds and argv."""
    args, _ = PROBLEMS[problem]
    module = out / "slow_map_module.py"
    module.write_text(SLOW_MAP_MODULE)
    argv = [
        sys.executable, "-m", "profiler", "tune", "--data", "synthetic", "--budget", str(budget_min),
        "--out", str(out), "--run-name", problem, *(a.format(module=module) for a in args),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    tune_json = out / problem / "tune.json"
    if not tune_json.is_file():
        raise SystemExit(f"{problem}: tune wrote no tune.json (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(tune_json.read_text()), wall, argv


def row(problem: str, document: dict, wall: float) -> str:
    expected = PROBLEMS[problem][1]
    trials = document.get("trials") or []
    kept = [trial for trial in trials if trial["kept"]]
    first = kept[0] if kept else (trials[0] if trials else None)
    runs = sum(len(trial["trials"]) for trial in trials)

    def ms(value) -> str:
        return "-" if value is None else f"{value:.1f}"

    base, best = document.get("baseline") or {}, document.get("best") or {}
    return (
        f"| {problem} | {first['rule'] if first else '-'} | {first['label'] if first else '-'} | "
        f"{'yes' if first and first['rule'] in expected and first['kept'] else 'no'} | "
        f"{ms(first and first['estimate_ms'])} | {ms(first and first['measured_ms'])} | "
        f"{ms(first and first['noise_ms'])} | {first['result'] if first else '-'} | "
        f"{ms(base.get('step_ms'))} → {ms(best.get('step_ms'))} | {len(trials)} | {runs} | "
        f"{document['status']} | {wall / 60:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=lambda text: text.split(","), default=list(PROBLEMS))
    parser.add_argument("--budget", type=float, default=7.0, help="each tune's --budget, minutes")
    parser.add_argument("--keep", type=Path, help="keep the tunes' folders here")
    args = parser.parse_args(argv)
    unknown = set(args.problems) - set(PROBLEMS)
    if unknown:
        parser.error(f"unknown problems {sorted(unknown)}; known: {','.join(PROBLEMS)}")
    with tempfile.TemporaryDirectory(prefix="devprof-bench-tune-") as scratch:
        out = args.keep or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        lines = [
            "| problem | fix kept (else first tried) | setting | the expected fix | estimate ms | measured ms | "
            "noise ms | result | step ms default → best | fixes tried | trial runs | status | minutes |",
            "|---|---|---|---|---:|---:|---:|---|---|---:|---:|---|---:|",
        ]
        for problem in args.problems:
            document, wall, _ = tune(problem, out, args.budget)
            lines.append(row(problem, document, wall))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    print(f"\ncommand: {shlex.join(['python', 'bench/bench_tune.py', *(argv or sys.argv[1:])])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
