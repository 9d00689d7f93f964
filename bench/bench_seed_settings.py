"""Every setting `devprof tune` can apply to the seed CNN, each tried alone against where tune starts
(TensorFlow's own setting) whatever the analysis advises: the check of what a tune left behind.

Each setting is compared as tune compares a fix (`Tuner.compare`: alternated `devprof run` trials of
the default and the setting, the same images on both sides, the rank test and the noise), so a row
here reads like a row of tune.json.

    python bench/bench_seed_settings.py [--batch-size 100] [--settings onednn_on,interop_1,...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from profiler.cli import tune  # noqa: E402

# name: (label, run options, environment, changes training). Each is tried alone from where tune starts
# (TensorFlow's own setting): bfloat16 only where asked for (emulated, and slow, on a CPU without its units).
SETTINGS: dict[str, tuple[str, dict[str, str | None], dict[str, str], bool]] = {
    "onednn_on": ("oneDNN on", {}, {tune.ONEDNN_ENV: "1"}, False),
    "interop_1": ("1 inter-op thread", {}, {tune.THREAD_ENV[1]: "1"}, False),
    "steps_per_call": ("16 steps per call", {"--steps-per-execution": "16"}, {}, False),
    "pipeline": ("the pipeline's stages in parallel, prefetched", {"--parallel-calls": "auto", "--prefetch": "auto"}, {}, False),
    "batch_2x": ("twice the batch", {"--batch-size": "{double}"}, {}, True),
    "xla": ("XLA compilation", {"--jit-compile": None}, {}, False),
    "bfloat16": ("bfloat16 precision", {"--precision": "mixed_bfloat16"}, {}, True),
}  # fmt: skip
DEFAULT_SETTINGS = [name for name in SETTINGS if name != "bfloat16"]


def ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--settings", type=lambda text: text.split(","), default=DEFAULT_SETTINGS)
    parser.add_argument("--keep", type=Path, help="keep the trials' run folders here")
    args = parser.parse_args(argv)
    unknown = set(args.settings) - set(SETTINGS)
    if unknown:
        parser.error(f"unknown settings {sorted(unknown)}; known: {','.join(SETTINGS)}")
    lines = [
        "| setting | default step ms | setting step ms | measured saving ms | noise ms | result | loss against default |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="devprof-bench-seed-") as scratch:
        out = args.keep or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        tuner = tune.Tuner(
            out,
            ["--data", "synthetic", "--batch-size", str(args.batch_size)],
            math.inf,
            batch_size=args.batch_size,
            epoch_images=tune.SEED_EPOCH_IMAGES,
            pipeline="cnn",
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
        for name in args.settings:
            label, options, env, changes_training = SETTINGS[name]
            options = {flag: value and value.format(double=2 * args.batch_size) for flag, value in options.items()}
            candidate = tune.Candidate(name, label, options, env, math.nan, changes_training)
            base, tried, _ = tuner.compare(tune.start_setting(), candidate)
            entry, _ = tuner.judge(tune.start_setting(), candidate, base, tried, False)

            loss = " / ".join(tune._cell(entry[key]) for key in ("loss", "baseline_loss")) if changes_training else "-"
            lines.append(
                f"| {label} | {ms(entry['baseline_step_ms'])} | {ms(entry['step_ms'])} | "
                f"{ms(entry['measured_ms'])} | {ms(entry['noise_ms'])} | {entry['result']} | {loss} |"
            )
            print(lines[-1], flush=True)
    print("\n".join(lines))
    print(f"\ncommand: {shlex.join(['python', 'bench/bench_seed_settings.py', *(argv or sys.argv[1:])])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
