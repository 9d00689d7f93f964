"""Savings checked by applying the fix: devprof's estimate against what the fix really saved.

For each cause, a small custom TensorFlow loop (an MLP, 256 -> 1024 -> 1024 -> 10, on synthetic
data, `tf.data`, a `tf.function` step) is recorded with `profiler.profile(profile_steps="5:25")`
and read with `analysis.analyze()`. The estimate is the verdict's `saving_ms` where its `cause` is
this cause's rule, else the matching finding's, else (for a part's rule, such as `host_bound`,
when the verdict named something else) that part's own estimate. The program then runs again
with the advised fix applied, and the measured saving is the steady mean step time before minus
after (per training step; per image times the original batch where the fix changes the batch).
Before and after are recorded alike and alternated, `--reps` pairs, so the machine's load drifts
over both.

Causes: slow_map (a map of matmuls on one core, slower than the step, behind a prefetch; fix:
num_parallel_calls), python_map (a map that runs 40 ms of Python a batch behind a prefetch; fix:
the Python moved out of the pipeline), no_prefetch (8 ms of CPU work per batch, no prefetch), no_prefetch_read (an
8 ms wait per batch, no prefetch), loop_sleep (20 ms in the loop; fix: the advised steps per
call), numpy_every_step (gradients through `.numpy()` into a histogram every step; fix: every N
steps as advised), tiny_batch (batch 8; fix: steps per call), tiny_batch_larger (batch 8; fix:
batch 128), eager (no tf.function), contention (two busy loops beside training; fix: stop them),
float32_run and bfloat16_run (the estimate of moving to the other dtype, from the cached `devprof
peak` in run.json, checked against the other dtype's run), loop_sleep_bf16 (a 15 ms sleep in the loop;
the change measured is mixed_bfloat16, ranked below the sleep's fix where it saves less),
python_generator (NumPy batches from a Python generator through `session.iterate()`, 15 ms of work
each; fix: precomputed), fill_every_step (a 256 MiB `tf.fill` in every step; fix: made once),
float64_model (layers made float64 by mistake; fix: float32); python_generator_bf16 and
fill_every_step_bf16 (those programs with mixed_bfloat16 applied: the precision estimate must hold
beside the injected problem). tiny_batch_larger is measured but carries no
estimate: devprof advises a larger batch without saying what it would save.

    .venv/bin/python bench/bench_savings.py                       # every cause, the table into BENCHMARKS.md
    .venv/bin/python bench/bench_savings.py --causes loop_sleep,eager --no-write

A cause is within tolerance when |estimate - measured| <= max(35 % of the estimate, 3 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FEATURES = 256
CLASSES = 10
WIDTH = 1024
WINDOW = "5:25"  # profile_steps of every run before a fix
STEPS = 30
TOLERANCE_PCT = 35.0
TOLERANCE_MS = 3.0
SECTION = "## Savings checked by applying the fix"


@dataclasses.dataclass(frozen=True)
class Program:
    """One training program: what it does wrong (or right) and how it is recorded."""

    batch: int = 128
    width: int = WIDTH  # units of the two hidden layers
    steps: int = STEPS  # training steps (calls x steps_per_call)
    window: str = WINDOW
    map_ms: float = 0.0  # CPU work of the pipeline's map, per batch, one thread (a busy wait in Python)
    map_wait_ms: float = 0.0  # a wait in the pipeline's map, per batch, as for a read from disk or network
    map_matmuls: int = 0  # CPU work of the pipeline's map, per batch, in TensorFlow ops on one thread
    map_parallel: bool = False  # map(num_parallel_calls=AUTOTUNE)
    prefetch: bool = True
    loop_sleep_ms: float = 0.0  # time.sleep in the loop, once per call
    numpy_every: int = 0  # every this many calls, the gradients through .numpy() for a histogram (0: never)
    eager: bool = False  # the step without tf.function
    steps_per_call: int = 1
    precision: str = "float32"
    hogs: int = 0  # busy-loop processes competing for the CPU
    fill_mib: int = 0  # a tensor of this many MiB filled in every step and read once (a fixed tensor made every step)
    fill_once: bool = False  # ... made once, outside the step (the advised fix)
    floatx: str = "float32"  # Keras' floatx when the model is built ("float64": made float64 by mistake)
    generator: bool = False  # batches from a Python generator through `session.iterate()`, not tf.data
    generator_ms: float = 0.0  # its NumPy work per batch (0: the batches precomputed, the advised fix)
    sample: bool = True
    sample_interval: float = 0.1


@dataclasses.dataclass
class Result:
    cause: str
    rule: str  # the verdict's cause or the finding read
    source: str  # "verdict" or "finding"
    estimate_ms: float
    measured_ms: float
    before_ms: float
    after_ms: float
    advice: str
    fix: str  # what was applied
    reps: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # (estimate, before, after)
    note: str = ""
    verdict: str = ""  # what the verdict said of the run before the fix: "bound (share), first fix"

    @property
    def error_ms(self) -> float:
        return self.estimate_ms - self.measured_ms

    @property
    def allowed_ms(self) -> float:
        return tolerance_ms(self.estimate_ms)

    @property
    def within(self) -> bool:
        return abs(self.error_ms) <= self.allowed_ms


def tolerance_ms(estimate_ms: float) -> float:
    return max(TOLERANCE_PCT / 100.0 * abs(estimate_ms), TOLERANCE_MS)


# ------------------------------------------------------------------ the programs


def _busy_ms(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def dataset(program: Program, batches: int):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    n = program.batch * 4
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=n).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(program.batch, drop_remainder=True).repeat().take(batches)
    if program.map_ms > 0 or program.map_wait_ms > 0:
        cost, wait = program.map_ms, program.map_wait_ms

        def work(xb):
            _busy_ms(cost)  # a preprocessing stage of known CPU cost
            time.sleep(wait / 1e3)  # a read of known latency, which takes no CPU
            return xb

        def preprocess(xb, yb):
            xb = tf.numpy_function(work, [xb], tf.float32, stateful=True)
            return tf.ensure_shape(xb, (program.batch, FEATURES)), yb

        ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE) if program.map_parallel else ds.map(preprocess)
    if program.map_matmuls > 0:
        mix = tf.constant(np.eye(FEATURES, dtype="float32"))
        count = program.map_matmuls

        def transform(xb, yb):
            for _ in range(count):  # an identity, paid in matmuls
                xb = tf.matmul(xb, mix)
            return xb, yb

        ds = ds.map(transform, num_parallel_calls=tf.data.AUTOTUNE) if program.map_parallel else ds.map(transform)
    options = tf.data.Options()
    options.threading.max_intra_op_parallelism = 1  # a stage's op on one core, as most decode and augment ops
    options.experimental_optimization.map_parallelization = False  # a map runs in parallel only where asked
    options.autotune.enabled = True
    options.experimental_optimization.inject_prefetch = False  # no prefetch unless the program asks for one
    ds = ds.with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE) if program.prefetch else ds


def numpy_batches(program: Program, batches: int):
    """A Python generator of NumPy batches, each after `generator_ms` of NumPy work (precomputed where 0)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(program.batch, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=program.batch).astype("int32")
    for _ in range(batches):
        if program.generator_ms:
            end = time.perf_counter() + program.generator_ms / 1e3
            while time.perf_counter() < end:  # augmentation in NumPy, one core, under the GIL
                x = np.tanh(x) * 1.0001
        yield x, y


def build(program: Program):
    """(step function, model, one step): `step(iterator)` runs `steps_per_call` training steps;
    `one_step(x, y)` one, for batches the loop hands it."""
    import tensorflow as tf

    width = program.width
    # float64 by mistake: layers made in it, as `set_floatx("float64")` makes them (a global policy, which the
    # recording sets, would override floatx)
    dtype = {"dtype": program.floatx} if program.floatx != "float32" else {}
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(FEATURES,)),
            tf.keras.layers.Dense(width, activation="relu", **dtype),
            tf.keras.layers.Dense(width, activation="relu", **dtype),
            tf.keras.layers.Dense(CLASSES, **dtype),
        ]
    )
    optimizer = tf.keras.optimizers.Adam()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fill = program.fill_mib * 2**20 // 4
    made_once = tf.fill([fill], 1.0) if fill and program.fill_once else None

    def one_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, tf.cast(logits, tf.float32))
            if fill:  # a tensor of fixed size: made in every step from the batch, or once
                held = made_once if made_once is not None else tf.fill([fill], tf.cast(x[0, 0], tf.float32))
                loss = loss + 1e-30 * tf.reduce_max(held)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, grads

    k = program.steps_per_call

    def call(iterator):
        if k == 1:
            return one_step(*next(iterator))
        loss, grads = one_step(*next(iterator))
        for _ in tf.range(k - 1):
            loss, grads = one_step(*next(iterator))
        return loss, grads

    return (call if program.eager else tf.function(call)), model, (one_step if program.eager else tf.function(one_step))


@contextlib.contextmanager
def hogs(count: int):
    """`count` busy-loop processes, stopped on leaving. Started through a shell that exits at once, so they
    are no children of training: the host sampler counts a process's children as its own CPU."""
    loop = f"{sys.executable} -c 'while True: pass' > /dev/null 2>&1 &"
    pids = []
    if count:
        started = subprocess.run(
            ["sh", "-c", " ".join(f"{loop} echo $!;" for _ in range(count))], capture_output=True, text=True, check=True
        )
        pids = [int(pid) for pid in started.stdout.split()]
        time.sleep(0.5)  # let them reach the CPU before training starts
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def precision_policy(policy: str):
    import keras

    before = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(before)


def record(out: Path, name: str, program: Program) -> Path:
    """Train `program` under `profiler.profile()`; the run directory."""
    import numpy as np

    import profiler

    k = program.steps_per_call
    calls = program.steps // k
    with precision_policy(program.precision):
        step, model, one_step = build(program)
        data = dataset(program, calls * k + 2) if not program.generator else None
        iterator = iter(data) if data is not None else None
        with (
            hogs(program.hogs),
            profiler.profile(
                out,
                run_name=name,
                profile_steps=program.window,
                sample=program.sample,
                sample_interval=program.sample_interval,
                quiet=True,
                config={
                    "model": "mlp",
                    "batch_size": program.batch,
                    "precision": program.precision,
                    "steps_per_execution": k,
                },
            ) as session,
        ):
            if program.generator:  # the loop hands each batch to the step
                for x, y in session.iterate(numpy_batches(program, calls)):
                    with session.step(images=program.batch):
                        one_step(x, y)
                return Path(out) / name
            for call in range(calls):
                with session.step(images=program.batch * k, steps=k):
                    loss, grads = step(iterator)
                if program.numpy_every and call % program.numpy_every == 0:  # a logging habit, through NumPy
                    values = np.concatenate([g.numpy().ravel() for g in grads])
                    counts, _ = np.histogram(values, bins=64)
                    session.log(
                        loss=float(loss.numpy()),
                        grad_norm=float(np.sqrt(np.dot(values, values))),
                        grad_zero=float(counts.max()),
                    )
                if program.loop_sleep_ms:
                    time.sleep(program.loop_sleep_ms / 1e3)
    return Path(out) / name


def unprofiled_step_ms(programs: list[Program], blocks: int = 8, steps: int = 10) -> list[float]:
    """Each program's median time per step over `blocks` blocks of `steps` steps, the programs' blocks
    alternated in one process, without the profiler: what the machine's drift does not reach."""
    runs = []
    for program in programs:
        with precision_policy(program.precision):
            step, _, _ = build(program)
        iterator = iter(dataset(program, blocks * steps + 1))
        step(iterator)  # traces the step
        runs.append((step, iterator))
    times: list[list[float]] = [[] for _ in programs]
    for _ in range(blocks):
        for (step, iterator), spent in zip(runs, times):
            began = time.perf_counter()
            for _ in range(steps):
                loss, _ = step(iterator)
            loss.numpy()
            spent.append((time.perf_counter() - began) / steps * 1e3)
    return [statistics.median(spent) for spent in times]


def analyze(run_dir: Path):
    import analysis

    return analysis.analyze(run_dir)


def step_ms(a, per_image_batch: int | None = None) -> float:
    """The steady mean time of one training step (a call's time over its steps); with
    `per_image_batch`, per image times that batch."""
    k = max(1, int(a.steps_per_call or 1))
    ms = float(a.mean["step_ms"]) / k
    if per_image_batch:
        batch = int(a.run["config"]["batch_size"])
        ms = ms / batch * per_image_batch
    return ms


PART_OF_RULE = {
    "host_bound": "host",
    "input_wait": "input",
    "input_bound": "input",
    "input_bound_high": "input",
    "compute_bound": "compute",
}


def estimate(a, rules: tuple[str, ...]) -> tuple[str, str, float, str]:
    """(rule, source, saving_ms, advice) for the first of `rules` that the verdict's cause or a finding
    names (in that order: each rule's estimate models its own fix); else the part's own estimate where
    a rule is a part's (source "part", the verdict named another cause); NaN where none applies."""
    from analysis.rules import bound_rules, table

    verdict = a.verdict
    for rule in rules:
        if verdict.get("cause") == rule and verdict.get("saving_ms") is not None:
            return rule, "verdict", float(verdict["saving_ms"]), " ".join(verdict.get("advice") or [])
        for fix in verdict.get("fixes") or ():
            if fix["rule"] == rule and fix.get("saving_ms") is not None:
                return rule, "fix", float(fix["saving_ms"]), fix["advice"]
        for finding in a.findings:
            if finding["rule"] == rule and finding.get("saving_ms") is not None:
                return rule, "finding", float(finding["saving_ms"]), finding["advice"]
    for rule in rules:
        part = PART_OF_RULE.get(rule)
        if part is not None:
            saving = bound_rules.part_savings(a.facts)[part]
            fix = table.RULES_BY_ID[rule].fix(a.facts)
            return rule, f"part (verdict: {verdict.get('cause')})", saving.ms(a.facts), fix
    return verdict.get("cause") or "-", "none", math.nan, " ".join(verdict.get("advice") or [])


def suggested_steps_per_call(advice: str) -> int:
    """k from "k steps inside one `tf.function` call" in the advice (0: not advised)."""
    match = re.search(r"(\d+) steps inside one `tf.function` call", advice)
    return int(match.group(1)) if match else 0


def verdict_said(a) -> str:
    """The part that holds the step and the first fix, as the verdict names them (the last pair's)."""
    verdict = a.verdict
    first = (verdict.get("first_fix") or {}).get("rule") or "none"
    return f"{verdict.get('bound')} ({verdict.get('bound_pct') or 0:.0f} %), first fix `{first}`"


def compare(
    cause: str,
    out: Path,
    before: Program,
    after: Callable[[str, object], tuple[Program, str]],
    rules: tuple[str, ...],
    per_image: bool = False,
    reps: int = 2,
    read: Callable[[object], tuple[str, str, float, str]] | None = None,
) -> Result:
    """Record `before`, read its estimate, record the fixed program `after(advice, analysis)`, measure;
    `reps` times, alternated (before, after, before, after, ...), so that the machine's load drifts over
    both alike. Each pair gives an estimate and a measured saving (mean steady step before minus after);
    the result is their medians over the pairs, so one pair caught by a burst of load does not decide it."""
    estimates, befores, afters = [], [], []
    rule = source = advice = fix = said = ""
    for rep in range(reps):
        a = analyze(record(out, f"{cause}-before-{rep}", before))
        said = verdict_said(a)
        rule, source, saving, advice = read(a) if read is not None else estimate(a, rules)
        fixed, fix = after(advice, a)
        b = analyze(record(out, f"{cause}-after-{rep}", fixed))
        estimates.append(saving)
        befores.append(step_ms(a))
        afters.append(step_ms(b, per_image_batch=before.batch if per_image else None))
        print(
            f"[{cause}] {rep}: {source} {rule}: estimate {saving:.2f} ms; before {befores[-1]:.2f} ms, after "
            f"({fix}) {afters[-1]:.2f} ms: measured {befores[-1] - afters[-1]:.2f} ms",
            flush=True,
        )
    median = statistics.median
    result = Result(
        cause,
        rule,
        source,
        median(estimates),
        median([b - a for b, a in zip(befores, afters)]),
        median(befores),
        median(afters),
        advice,
        fix,
        list(zip(estimates, befores, afters)),
        verdict=said,
    )
    print(
        f"[{cause}] advice: {advice}\n[{cause}] estimate {result.estimate_ms:.2f} ms, measured "
        f"{result.measured_ms:.2f} ms, error {result.error_ms:+.2f} ms ({'within' if result.within else 'beyond'} "
        f"{result.allowed_ms:.2f} ms)",
        flush=True,
    )
    return result


def advised_steps(advice: str, a) -> int:
    """The steps per call the advice names, else the ones the rules suggest for this run."""
    from analysis.rules.advice_loop import _steps_per_call

    return suggested_steps_per_call(advice) or _steps_per_call(a.facts)[1]


def steps_per_call_fix(before: Program, calls: int = 8):
    """The fix "k steps per call" (k as advised): the first call (which traces) untraced, `calls` traced."""

    def after(advice: str, a) -> tuple[Program, str]:
        k = advised_steps(advice, a)
        return (
            dataclasses.replace(before, steps_per_call=k, steps=(calls + 2) * k, window=f"{k}:{(1 + calls) * k}"),
            f"{k} steps per call",
        )

    return after


def every_n_steps_fix(before: Program, calls: int = 2):
    """The fix "do it every N steps" (N as advised, the steps per call it suggests), `calls` times N traced."""

    def after(advice: str, a) -> tuple[Program, str]:
        n = advised_steps(advice, a)
        return (
            dataclasses.replace(before, numpy_every=n, window=f"5:{5 + calls * n}", steps=10 + calls * n),
            f"every {n} steps",
        )

    return after


def changed(before: Program, fix: str, **change) -> Callable[[str, object], tuple[Program, str]]:
    """A fix that changes the program the same way whatever the advice said."""
    return lambda advice, a: (dataclasses.replace(before, **change), fix)


# ------------------------------------------------------------------ the causes
# Each takes the runs' folder and the repetitions, and returns its Result.

HOST_RULES = ("host_bound",)
INPUT_RULES = ("no_prefetch", "input_wait", "input_bound_high", "input_bound")


def slow_map(out: Path, reps: int = 2) -> Result:
    """The pipeline prefetches, but its map (matmuls on one core, about 40 ms a batch) is slower than the step."""
    before = Program(map_matmuls=160)
    return compare(
        "slow_map",
        out,
        before,
        changed(before, "map(num_parallel_calls=AUTOTUNE)", map_parallel=True),
        ("input_wait", "input_bound_high", "input_bound"),
        reps=reps,
    )


def python_map(out: Path, reps: int = 2, wait_ms: float = 40.0) -> Result:
    """The pipeline prefetches, but its map runs Python (`tf.numpy_function`) that waits 40 ms a batch; the advice
    for a Python stage: move it out of the pipeline (precompute, then `.cache()`): the map is gone."""
    before = Program(map_wait_ms=wait_ms)
    return compare(
        "python_map",
        out,
        before,
        changed(before, "the Python map precomputed", map_wait_ms=0.0),
        ("input_wait", "input_bound_high", "input_bound"),
        reps=reps,
    )


def no_prefetch(out: Path, reps: int = 2) -> Result:
    """A map of 8 ms of CPU work a batch and no prefetch: the loop waits for every batch."""
    before = Program(map_ms=8.0, prefetch=False)
    return compare(
        "no_prefetch", out, before, changed(before, "prefetch(AUTOTUNE)", prefetch=True), INPUT_RULES, reps=reps
    )


def no_prefetch_read(out: Path, reps: int = 2) -> Result:
    """A map that waits 8 ms a batch (a read) and no prefetch."""
    before = Program(map_wait_ms=8.0, prefetch=False)
    return compare(
        "no_prefetch_read", out, before, changed(before, "prefetch(AUTOTUNE)", prefetch=True), INPUT_RULES, reps=reps
    )


def loop_sleep(out: Path, reps: int = 2) -> Result:
    """time.sleep(20 ms) in the loop after every call."""
    before = Program(loop_sleep_ms=20.0)
    return compare("loop_sleep", out, before, steps_per_call_fix(before), HOST_RULES, reps=reps)


def numpy_every_step(out: Path, reps: int = 2) -> Result:
    """Every step's gradients brought to NumPy (`.numpy()`) for a histogram and a norm; the advice
    says to do it every N steps (N: the steps per call it suggests)."""
    before = Program(numpy_every=1)
    return compare("numpy_every_step", out, before, every_n_steps_fix(before), HOST_RULES, reps=reps)


def tiny_batch(out: Path, reps: int = 2) -> Result:
    """Batch 8: each step pays the call's dispatch and Adam's update of every weight for 8 images; the
    advised fix, several steps per call."""
    before = Program(batch=8)
    return compare("tiny_batch", out, before, steps_per_call_fix(before), HOST_RULES, reps=reps)


def tiny_batch_larger(out: Path, reps: int = 2) -> Result:
    """Batch 8 again; the other advised fix, a 16 times larger batch, measured per image times 8."""
    before = Program(batch=8)
    no_estimate = lambda a: ("larger batch", "no estimate", math.nan, "")  # noqa: E731
    return compare(
        "tiny_batch_larger",
        out,
        before,
        changed(before, "batch 128", batch=128),
        HOST_RULES,
        per_image=True,
        reps=reps,
        read=no_estimate,
    )


def eager(out: Path, reps: int = 2, width: int = WIDTH) -> Result:
    """The step without tf.function."""
    before = Program(eager=True, width=width)
    return compare(
        "eager" if width == WIDTH else f"eager_width{width}",
        out,
        before,
        changed(before, "tf.function on the step", eager=False),
        ("eager_execution", "host_bound"),
        reps=reps,
    )


def contention(out: Path, reps: int = 2) -> Result:
    """Two busy-loop processes beside training on the 2 cores."""
    before = Program(hogs=2)
    return compare(
        "contention",
        out,
        before,
        changed(before, "the competing processes stopped", hogs=0),
        ("cpu_contention",),
        reps=reps,
    )


def _precision_change(a) -> tuple[str, str, float, str]:
    """The estimate of moving to the other dtype (negative: slower), whatever the verdict picked."""
    from analysis.rules import savings
    from analysis.rules.advice_compute import precision_advice

    saving = savings.precision_saving(a.facts)
    return "precision change", "estimate", saving.ms(a.facts), precision_advice(a.facts) or ""


def _precision_note(result: Result) -> Result:
    f32, bf16 = unprofiled_step_ms([Program(precision="float32"), Program(precision="mixed_bfloat16")])
    result.note = (
        f"unprofiled, 8 blocks of 10 steps alternated: float32 {f32:.2f}, mixed_bfloat16 {bf16:.2f} ms a step (medians)"
    )
    print(f"[{result.cause}] {result.note}", flush=True)
    return result


def float32_run(out: Path, reps: int = 2) -> Result:
    """float32, with the run's measured peak: the estimate of switching to mixed_bfloat16 (negative where the
    measured ceilings say bfloat16 is slower, and the advice then keeps float32) against the measured run."""
    before = Program(precision="float32")
    return _precision_note(
        compare(
            "float32_run",
            out,
            before,
            changed(before, "mixed_bfloat16", precision="mixed_bfloat16"),
            (),
            reps=reps,
            read=_precision_change,
        )
    )


def bfloat16_run(out: Path, reps: int = 2) -> Result:
    """mixed_bfloat16, with the run's measured peak: the estimate of going back to float32 (positive where the
    measured ceilings say bfloat16 is slower: `bf16_without_matrix_units`) against the measured float32 run."""
    before = Program(precision="mixed_bfloat16")
    return _precision_note(
        compare(
            "bfloat16_run",
            out,
            before,
            changed(before, "float32", precision="float32"),
            (),
            reps=reps,
            read=_precision_change,
        )
    )


def _bf16_applied(cause: str, before: Program) -> Callable[[Path, int], Result]:
    """A program with one injected problem; the change measured is mixed_bfloat16, against the estimate devprof
    gives for it (which must hold, and rank below the problem's own fix where it saves less)."""

    def run(out: Path, reps: int = 2) -> Result:
        return compare(
            cause,
            out,
            before,
            changed(before, "mixed_bfloat16", precision="mixed_bfloat16"),
            (),
            reps=reps,
            read=_precision_change,
        )

    run.__doc__ = f"{cause}: {before}, mixed_bfloat16 applied"
    return run


loop_sleep_bf16 = _bf16_applied("loop_sleep_bf16", Program(loop_sleep_ms=15.0))  # a 15 ms sleep in the loop
python_generator_bf16 = _bf16_applied("python_generator_bf16", Program(generator=True, generator_ms=15.0))
fill_every_step_bf16 = _bf16_applied("fill_every_step_bf16", Program(fill_mib=256))


def python_generator(out: Path, reps: int = 2) -> Result:
    """Batches from a Python generator (15 ms of NumPy a batch) through `session.iterate()`, no tf.data; the
    advice: build them in tf.data or precompute them: precomputed."""
    before = Program(generator=True, generator_ms=15.0)
    return compare(
        "python_generator",
        out,
        before,
        changed(before, "the batches precomputed", generator_ms=0.0),
        ("input_wait", "input_bound_high", "input_bound"),
        reps=reps,
    )


def fill_every_step(out: Path, reps: int = 2) -> Result:
    """A 256 MiB `tf.fill` made in every step (a fixed tensor); the advice: make it once."""
    before = Program(fill_mib=256)
    return compare(
        "fill_every_step",
        out,
        before,
        changed(before, "the tensor made once", fill_once=True),
        ("memory_one_holder",),
        reps=reps,
    )


def float64_model(out: Path, reps: int = 2) -> Result:
    """A model made float64 by mistake (`set_floatx("float64")`); the advice: float32."""
    before = Program(floatx="float64")
    return compare(
        "float64_model", out, before, changed(before, "float32", floatx="float32"), ("float64_math",), reps=reps
    )


CAUSES: dict[str, Callable[..., Result]] = {
    "slow_map": slow_map,
    "python_map": python_map,
    "no_prefetch": no_prefetch,
    "no_prefetch_read": no_prefetch_read,
    "loop_sleep": loop_sleep,
    "numpy_every_step": numpy_every_step,
    "tiny_batch": tiny_batch,
    "tiny_batch_larger": tiny_batch_larger,
    "eager": eager,
    "contention": contention,
    "float32_run": float32_run,
    "bfloat16_run": bfloat16_run,
    "loop_sleep_bf16": loop_sleep_bf16,
    "python_generator": python_generator,
    "fill_every_step": fill_every_step,
    "float64_model": float64_model,
    "python_generator_bf16": python_generator_bf16,
    "fill_every_step_bf16": fill_every_step_bf16,
}


# ------------------------------------------------------------------ the table


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    import tensorflow as tf

    units: list[str] = [name for name in ("avx512_bf16", "amx_bf16") if name in flags] or ["no bfloat16 units"]
    return (
        f"{model} ({', '.join(units)}), {os.cpu_count()} logical cores, Linux, Python "
        f"{platform.python_version()}, TensorFlow {tf.__version__}"
    )


def peak_line() -> str:
    """The cached `devprof peak` the runs carried in run.json (what precision advice compares)."""
    from profiler.roofline import peak

    cached = peak.cached_for_run("cpu", peak.device_name("cpu"))
    if not cached:
        return "no `devprof peak` cached: the precision runs had no measured ceilings"
    rates = ", ".join(f"{dtype} {rate / 1e9:.0f}" for dtype, rate in sorted(cached["peak_flops_per_second"].items()))
    return f"`devprof peak` in the runs' run.json (cached {cached.get('measured_at', '?')}): {rates} GFLOP/s"


def _error(r: Result) -> str:
    share = f" ({100 * r.error_ms / r.measured_ms:+.0f} % of measured)" if abs(r.measured_ms) >= 0.05 else ""
    return f"{r.error_ms:+.2f} ms{share}"


def table(results: list[Result]) -> str:
    rows = [
        "| cause | verdict: bound, first fix | estimate read | estimate ms | measured ms | error | within tolerance |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.estimate_ms != r.estimate_ms:
            rows.append(f"| {r.cause} | {r.verdict} | {r.source} (`{r.rule}`) | – | {r.measured_ms:.2f} | – | – |")
            continue
        rows.append(
            f"| {r.cause} | {r.verdict} | {r.source} `{r.rule}` | {r.estimate_ms:.2f} | {r.measured_ms:.2f} | "
            f"{_error(r)} | {'yes' if r.within else '**no**'} (±{r.allowed_ms:.2f}) |"
        )
    rows += [
        "",
        "| cause | fix applied | before ms/step (median) | after ms/step (median) | per pair: estimate, "
        "before, after (ms) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        reps = "; ".join(f"{e:.2f}, {b:.2f}, {a:.2f}" for e, b, a in r.reps)
        note = f"; {r.note}" if r.note else ""
        rows.append(f"| {r.cause} | {r.fix} | {r.before_ms:.2f} | {r.after_ms:.2f} | {reps}{note} |")
    return "\n".join(rows)


READING = "\n### Reading"  # hand-written text after the table, kept when the table is written again


def write_section(path: Path, text: str) -> None:
    """Replace the section's table in BENCHMARKS.md (or add the section at the end), keeping its Reading."""
    doc = path.read_text()
    start = doc.find(SECTION)
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    else:
        ends = [i for i in (doc.find(READING, start), doc.find("\n## ", start + len(SECTION))) if i >= 0]
        end = min(ends) if ends else -1
        doc = doc[:start] + text.rstrip("\n") + "\n" + (doc[end:] if end >= 0 else "")
    path.write_text(doc)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--causes", default=",".join(CAUSES), help=f"comma-separated, of: {', '.join(CAUSES)}")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--benchmarks", default=str(REPO / "BENCHMARKS.md"), help="the Markdown file to update")
    parser.add_argument("--reps", type=int, default=2, help="before/after pairs per cause, alternated")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.causes.split(",") if c.strip()]
    unknown = [c for c in names if c not in CAUSES]
    if unknown:
        parser.error(f"unknown cause(s): {', '.join(unknown)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = Path(args.out or tempfile.mkdtemp(prefix="devprof-bench-savings-"))
    load = os.getloadavg()[0]
    began = time.monotonic()
    results = [CAUSES[name](out, reps=args.reps) for name in names]
    minutes = (time.monotonic() - began) / 60
    command = (
        "python bench/bench_savings.py"
        + (f" --causes {','.join(names)}" if names != list(CAUSES) else "")
        + (f" --reps {args.reps}" if args.reps != 2 else "")
    )
    text = (
        f"{SECTION}\n\n`{command}` ({minutes:.1f} min, {args.reps} before/after pairs per cause, alternated), "
        f"{machine()}; load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end (other jobs "
        f"on the machine); {peak_line()}. Per pair, measured = the mean steady step before minus after; a "
        f"cause's estimate and measured saving are the medians over its pairs; within tolerance: |error| <= "
        f"max({TOLERANCE_PCT:g} % of the estimate, {TOLERANCE_MS:g} ms).\n\n{table(results)}\n"
    )
    print(text)
    if not args.no_write:
        write_section(Path(args.benchmarks), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
