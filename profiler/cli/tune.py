"""`devprof tune`: try the fixes the analysis ranks, each in short trials alternated with the baseline,
keep what helps, and try again from there, until nothing left saves more than the noise or the budget
is spent.

Every trial is one `devprof run` of a few dozen steps in its own process (threads, oneDNN and XLA are
set when TensorFlow starts), in a run folder of its own under the tune's folder; its step time is the
median of its calls after the first ones (compiling and warming up), per training step. A fix is kept
only where the candidate's trials are faster than the baseline's by rank and by more than their noise
(`analysis.rules.trials`), and, where it changes training (precision, batch size), where its loss after
the same images is neither NaN nor more than 10 % above the baseline's.

The first baseline is TensorFlow's own setting (`--tensorflow-defaults`), the one a program gets outside
devprof: where TensorFlow leaves a CPU without oneDNN, devprof's own default would hide that fix.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from analysis.rules import trials as trial_rules

SCHEMA = "devprof.tune/1"
WARMUP_CALLS = 2  # a trial's first calls compile and warm up: left out of its step time
TRIAL_STEPS = 64  # training steps a trial runs (fixes of up to 16 steps per call still measure 2 calls)
PAIRS = 3  # alternated trials a side, at least: 3 is the fewest a rank test can be sure with
MAX_PAIRS = 5  # a side, where the first ones were not sure and the budget allows
LOSS_LIMIT = 1.10  # a fix that changes training may end at most 10 % above the baseline's loss
DEFAULT_BUDGET_MIN = 15.0
SEED_EPOCH_IMAGES = 50_000  # CIFAR-10's training set (and the synthetic one's)
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
STATUSES = ("running", "finished", "interrupted", "failed", "budget_spent")


@dataclass
class Setting:
    """What the trials' `devprof run` is told beyond the user's own options: run options (flag to value;
    None for a switch) and environment variables, and the fixes (rule ids) that chose them."""

    options: dict[str, str | None] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    fixes: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return [token for flag, value in self.options.items() for token in ([flag] if value is None else [flag, value])]

    def with_fix(self, candidate: Candidate) -> Setting:
        return Setting(
            {**self.options, **candidate.options}, {**self.env, **candidate.env}, (*self.fixes, candidate.rule)
        )

    def document(self) -> dict:
        return {"fixes": list(self.fixes), "options": dict(self.options), "env": dict(self.env)}


def start_setting() -> Setting:
    """Where tune starts: TensorFlow's own CPU kernels and threads (`devprof run --tensorflow-defaults`),
    as the seed program and the user's own program get them, so that the oneDNN devprof would turn on by
    itself is a fix measured and written into the code, not a difference hidden in the baseline."""
    return Setting({"--tensorflow-defaults": None})


@dataclass(frozen=True)
class Candidate:
    """A fix the analysis ranked, as a change of setting tune can apply."""

    rule: str
    label: str
    options: dict[str, str | None]
    env: dict[str, str]
    estimate_ms: float  # the analysis' estimated saving per training step
    changes_training: bool = False  # precision or batch size: its loss is checked

    @property
    def key(self) -> str:
        """The rule and what it sets: a rule answered by one setting may be tried again with another."""
        return "+".join([self.rule, *sorted(self.options), *sorted(self.env)])


@dataclass(frozen=True)
class Measured:
    """One trial: its run folder, median step time per training step, images per second, final loss."""

    run_dir: Path
    step_ms: float
    images_per_second: float
    loss: float


def measured(run_dir: Path) -> Measured:
    """A finished trial's numbers, from its steps.csv and run.json as the analysis reads them (a row cut
    short or written twice by a trial that was stopped is left out the same way); raises RunFileError."""
    from analysis.read import run_csvs, run_files

    steps = run_csvs.read_steps_csv(run_dir / run_files.STEPS_CSV)
    steady = steps.iloc[WARMUP_CALLS:] if len(steps) > WARMUP_CALLS else steps
    per_step = steady["step_ms"] / steady["steps"].clip(lower=1)
    seconds = float(steady["step_ms"].sum()) / 1000.0
    record = run_files.read_run_json(run_dir / run_files.RUN_JSON)
    epochs = record.get("epochs") or [{}]
    loss = epochs[-1].get("loss")
    return Measured(
        run_dir,
        float(per_step.median()) if len(per_step) else math.nan,
        float(steady["images"].sum()) / seconds if seconds > 0 else math.nan,
        float(loss) if isinstance(loss, (int, float)) else math.nan,
    )


# The rules each setting answers, in the order tried where a rule has several.
PIPELINE_RULES = ("input_wait", "no_prefetch")
PER_CALL_RULES = ("host_bound", "launch_bound", "host_sync")
XLA_RULES = ("below_roofline", "compute_bound")
BATCH_RULES = (*PER_CALL_RULES, *XLA_RULES)  # a larger batch: fewer steps for the same fixed cost, more work a kernel
MAX_STEPS_PER_CALL = 16
THREAD_ENV = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def candidates(
    verdict: dict,
    mean: dict,
    steps_per_call: int,
    setting: Setting,
    tried: set[str],
    pipeline: str | None,
    *,
    batch_size: int = 0,
    max_batch: float = math.nan,
    facts: object = None,
) -> tuple[list[Candidate], list[dict]]:
    """The verdict's fixes (`verdict.fixes`, best first) that tune can apply from `setting` and has not
    tried (`tried`: their `key`s), and the others as advice (`{rule, advice}`). `pipeline`: "cnn" (the
    CNN's own, whose stages tune sets), "dataset" (the user's tf.data pipeline, given tf.data's options)
    or None. `max_batch`: the largest batch the measured memory headroom fits (NaN: unknown, no larger
    batch is tried). `facts`: the analysis' facts (the CPU others took, for the threads)."""
    from analysis.rules.advice_loop import suggest_steps_per_execution

    found: list[Candidate] = []
    advice: list[dict] = []
    calls = max(steps_per_call, 1)
    for fix in verdict.get("fixes") or ():
        # The analysis' saving is per call where a call runs several steps; a trial's step time is per step.
        rule, estimate = str(fix.get("rule")), float(fix.get("saving_ms") or math.nan) / calls
        options: list[Candidate] = []
        if rule in PIPELINE_RULES and pipeline is not None and "--parallel-calls" not in setting.options:
            label = "the pipeline's stages in parallel, prefetched" if pipeline == "cnn" else "tf.data's AUTOTUNE"
            options.append(Candidate(rule, label, {"--parallel-calls": "auto", "--prefetch": "auto"}, {}, estimate))
        if rule in PER_CALL_RULES:
            # At most MAX_STEPS_PER_CALL, where the advice asks more: a trial still times calls past its warm-up,
            # and 16 steps a call already take 15/16 of a once-a-call overhead away.
            per_call = min(
                MAX_STEPS_PER_CALL,
                suggest_steps_per_execution(
                    mean.get("host_pct", math.nan), mean.get("compute_pct", math.nan), steps_per_call
                ),
            )
            if steps_per_call < per_call:
                options.append(
                    Candidate(
                        rule, f"{per_call} steps per call", {"--steps-per-execution": str(per_call)}, {}, estimate
                    )
                )
        if rule == "fp32_on_matrix_units" and setting.options.get("--precision") is None:
            options.append(Candidate(rule, "bfloat16 precision", {"--precision": "mixed_bfloat16"}, {}, estimate, True))
        if rule in XLA_RULES and "--jit-compile" not in setting.options:
            options.append(Candidate(rule, "XLA compilation", {"--jit-compile": None}, {}, estimate))
        if rule in XLA_RULES and setting.options.get("--precision") is None:
            # The compute is the problem: the other dtype, where the measured ceilings say it is faster,
            # estimated as the analysis estimates a precision change (`savings.precision_saving`).
            policy, saving = _reduced_precision(facts)
            if saving > 0:
                label = f"{policy.removeprefix('mixed_')} precision"
                options.append(Candidate(rule, label, {"--precision": policy}, {}, saving / calls, True))
        if rule == "cpu_without_onednn" and ONEDNN_ENV not in setting.env:
            options.append(Candidate(rule, "oneDNN on", {}, {ONEDNN_ENV: "1"}, estimate))
        if rule == "cpu_contention" and THREAD_ENV[0] not in setting.env:
            threads = _threads_left(facts)
            if threads is not None:
                env = {THREAD_ENV[0]: str(threads), THREAD_ENV[1]: "1"}
                options.append(Candidate(rule, f"{threads} TensorFlow thread(s)", {}, env, estimate))
        if rule in BATCH_RULES and batch_size > 0 and max_batch == max_batch:
            larger = min(2 * batch_size, int(max_batch))
            if larger > batch_size and "--batch-size" not in setting.options:
                options.append(Candidate(rule, f"batch {larger}", {"--batch-size": str(larger)}, {}, estimate, True))
        # A rule's settings in the order of their own estimates (most first); a setting found already is not
        # tried twice under another rule's name.
        options.sort(key=lambda each: -each.estimate_ms if each.estimate_ms == each.estimate_ms else math.inf)
        found += [
            each
            for each in options
            if each.key not in tried
            and each.key not in {f.key for f in found}
            and (each.options, each.env) not in [(f.options, f.env) for f in found]
        ]
        if not options:
            advice.append({"rule": rule, "advice": fix.get("advice")})
    return found, advice


def _reduced_precision(facts: object) -> tuple[str, float]:
    """The mixed-precision policy a float32 run would move to, and the saving per call (the analysis'
    step) it estimates for it from the measured ceilings (NaN where it cannot: no facts, no ceilings)."""
    from analysis.rules import savings
    from analysis.rules.devices import facts_for
    from analysis.rules.facts import Facts

    if not isinstance(facts, Facts) or (facts.precision or "float32") != "float32":
        return "", math.nan
    return facts_for(facts.device).mixed_precision, savings.precision_saving(facts).ms(facts)


def _threads_left(facts: object) -> int | None:
    """TensorFlow's threads for this worker's share of the cores, where the processes that took CPU
    include other workers of the same job on this machine: their thread pools, each as large as the
    machine, are what a thread count can stop competing. None otherwise (other programs' CPU is theirs:
    stopping them is the advice) or where the trace does not say."""
    try:
        cores, others = float(getattr(facts, "cpu_cores")), float(getattr(facts, "other_cpu_pct"))
        neighbours = int(getattr(facts, "job_workers_here") or 0)
    except (AttributeError, TypeError, ValueError):
        return None
    if not (math.isfinite(cores) and math.isfinite(others)) or cores < 2 or neighbours < 1:
        return None
    return max(1, int(cores) // (neighbours + 1))


def code_for(setting: Setting, pipeline: str | None) -> str:
    """The best setting as the code a user writes in their own Keras program."""
    lines: list[str] = []
    for key, value in setting.env.items():
        lines.append(f'os.environ["{key}"] = "{value}"  # before TensorFlow is imported')
    options = setting.options
    if options.get("--precision"):
        lines.append(f'tf.keras.mixed_precision.set_global_policy("{options["--precision"]}")  # before the model')
    if "--parallel-calls" in options or "--prefetch" in options:
        if pipeline == "cnn":
            lines.append("dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)")
        else:
            lines += [
                "options = tf.data.Options()",
                "options.autotune.enabled = True",
                "options.experimental_optimization.map_parallelization = True",
                "dataset = dataset.with_options(options)",
            ]
        lines.append("dataset = dataset.prefetch(tf.data.AUTOTUNE)")
    if "--batch-size" in options:
        lines.append(f"dataset = dataset.batch({options['--batch-size']})  # or model.fit(..., batch_size=...)")
    compile_args = []
    if "--steps-per-execution" in options:
        compile_args.append(f"steps_per_execution={options['--steps-per-execution']}")
    if "--jit-compile" in options:
        compile_args.append("jit_compile=True")
    if compile_args:
        lines.append(f"model.compile(optimizer, loss, {', '.join(compile_args)})")
    return "\n".join(lines)


Runner = Callable[[list[str], dict[str, str]], int]  # `devprof run` argv and extra environment -> exit code


def run_in_process(argv: list[str], env: dict[str, str]) -> int:
    """`devprof run ARGV` in a fresh Python, with `env` added to this process's environment."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "profiler", "run", *argv],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ).returncode


class Tuner:
    """One tune: its folder, the user's run options, the budget; `run()` gives tune.json's document."""

    def __init__(
        self,
        tune_dir: Path,
        user_argv: Sequence[str],
        budget_s: float,
        *,
        batch_size: int,
        epoch_images: int,
        pipeline: str | None,
        runner: Runner | None = None,
        analyze: Callable[[Path], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = print,
        measure_peak: bool = True,
        max_pairs: int = MAX_PAIRS,
    ):
        self.tune_dir, self.user_argv, self.budget_s = tune_dir, list(user_argv), budget_s
        self.batch_size, self.epoch_images, self.pipeline = batch_size, epoch_images, pipeline
        self.runner, self.clock, self.say = runner or run_in_process, clock, say
        self.analyze = analyze or _analyze
        self.measure_peak, self.max_pairs = measure_peak, max_pairs
        self.started = clock()
        self.count = 0
        self.document: dict = {
            "schema": SCHEMA,
            "status": "running",
            "budget_s": budget_s,
            "baseline": None,
            "best": None,
            "trials": [],
            "advice": [],
            "best_against_default": None,
        }

    # ---- trials

    def left_s(self) -> float:
        return self.budget_s - (self.clock() - self.started)

    def batch_of(self, setting: Setting) -> int:
        return int(setting.options.get("--batch-size") or self.batch_size)

    def trial(self, setting: Setting, kind: str, profile: bool = False, images: int = 0) -> Measured | None:
        """One trial run of `setting` on `images` (default: TRIAL_STEPS of its batches); None where it failed."""
        self.count += 1
        name = f"{self.count:02d}-{kind}"
        images = images or self.batch_of(setting) * TRIAL_STEPS
        argv = [
            *self.argv(setting),
            "--epochs",
            "1",
            "--limit-images",
            str(images),
            "--limit-test-images",
            str(self.batch_size),
            "--out",
            str(self.tune_dir),
            "--run-name",
            name,
            "--quiet",
            # The profiled baseline carries the device's measured peak (measured once, then cached): the
            # ceilings a precision change is estimated from.
            *((["--measure-peak"] if self.measure_peak else []) if profile else ["--no-profile", "--no-sample"]),
        ]
        self.say(f"trial {self.count}: {kind} ({max(0.0, self.left_s()) / 60:.1f} min of the budget left)")
        code = self.runner(argv, setting.env)
        run_dir = self.tune_dir / name
        if code != 0 or not (run_dir / "steps.csv").is_file():
            return None
        from analysis.read.run_files import RunFileError

        try:
            return measured(run_dir)
        except RunFileError:
            return None

    def compare(self, base: Setting, candidate: Candidate) -> tuple[list[Measured], list[Measured], bool]:
        """Alternated trials of the baseline and the candidate: PAIRS each, more where not sure and the
        budget allows; no trial starts once the budget is spent. The last bool: stopped by the budget."""
        tried = base.with_fix(candidate)
        # Both sides train on the same images, so that a larger batch's loss is compared after as many.
        images = TRIAL_STEPS * max(self.batch_of(base), self.batch_of(tried))
        sides: tuple[list[Measured], list[Measured]] = ([], [])
        for pair in range(self.max_pairs):
            if pair >= PAIRS:
                verdict = self.verdict(base, tried, sides[0], sides[1])
                if verdict.result != trial_rules.NOT_SURE:
                    break
            for side, (setting, kind) in enumerate(((base, "baseline"), (tried, candidate.rule))):
                if self.left_s() <= 0:
                    return sides[0], sides[1], True
                result = self.trial(setting, kind, images=images)
                if result is not None:
                    sides[side].append(result)
        return sides[0], sides[1], False

    def verdict(self, base: Setting, tried: Setting, base_runs: list[Measured], tried_runs: list[Measured]):
        """The rank test on time per step, a larger batch's steps counted at the baseline's batch (the
        time the baseline's images of a step take)."""
        scale = self.batch_of(base) / self.batch_of(tried)
        return trial_rules.compare_trials([m.step_ms for m in base_runs], [m.step_ms * scale for m in tried_runs])

    # ---- the loop

    def run(self) -> dict:
        setting = start_setting()
        tried: set[str] = set()
        current: list[Measured] = []  # the trials of the setting kept so far (its latest comparison's)
        first_baseline: list[Measured] | None = None
        while self.left_s() > 0:
            profiled = self.trial(setting, "baseline-profile", profile=True)
            if profiled is None:
                self.document["status"] = "failed"
                self.document["why"] = "the baseline run failed: run `devprof run` with the same options to see why"
                return self.document
            if self.document["baseline"] is None:
                self.document["baseline"] = self.summary(setting, [profiled])
            analysis = self.analyze(profiled.run_dir)
            verdict, mean = getattr(analysis, "verdict", {}), getattr(analysis, "mean", {})
            # The run's own (the user's --steps-per-execution too), as the analysis read it from the trace.
            steps_per_call = _whole(getattr(analysis, "steps_per_call", None)) or int(
                setting.options.get("--steps-per-execution") or 1
            )
            found, advice = candidates(
                verdict,
                mean,
                steps_per_call,
                setting,
                tried,
                self.pipeline,
                batch_size=self.batch_of(setting),
                max_batch=_max_batch(getattr(analysis, "memory", None)),
                facts=getattr(analysis, "facts", None),
            )
            self.document["advice"] = advice
            current = current or [profiled]
            kept: tuple[Candidate, list[Measured]] | None = None
            for candidate in found:
                tried.add(candidate.key)
                base, cand, stopped = self.compare(setting, candidate)
                if first_baseline is None and base:
                    first_baseline = base  # the default setting, measured as every trial is (no profiler)
                    self.document["baseline"] = self.summary(start_setting(), base)
                entry, keep = self.judge(setting, candidate, base, cand, stopped)
                self.document["trials"].append(entry)
                self.write()
                current = base or current
                if keep:
                    kept = (candidate, cand)
                    break  # fixing one part uncovers the next: analysed again from the new baseline
                if stopped:
                    break
            if kept is None:
                break
            setting, current = setting.with_fix(kept[0]), kept[1]
        # Nothing kept: the best is the default, and its numbers are the baseline's (not the later trials' of the
        # same setting, which would show a difference that is only the machine's drift).
        kept_nothing = not setting.fixes and first_baseline is not None
        best = self.document["baseline"] if kept_nothing else self.summary(setting, current)
        if setting.fixes and self.left_s() > 0:
            best = self.side_by_side(setting) or best
        self.document["status"] = "budget_spent" if self.left_s() <= 0 else "finished"
        self.document["best"] = {**best, "command": self.command(setting), "code": code_for(setting, self.pipeline)}
        return self.document

    def side_by_side(self, setting: Setting) -> dict | None:
        """The default and the best setting in alternated trials of their own, where the budget allows: the
        seconds per epoch of each from the same minutes (each fix was measured against its own baseline, and a
        machine drifts between them). Sets `baseline` and `best_against_default`; gives the best's summary."""
        start = start_setting()
        whole = Candidate("best", "the best setting", dict(setting.options), dict(setting.env), math.nan)
        base, best, stopped = self.compare(start, whole)
        if not base or not best:
            return None
        verdict = self.verdict(start, setting, base, best)
        self.document["baseline"] = self.summary(start, base)
        self.document["best_against_default"] = {
            "result": verdict.result,
            "measured_ms": _finite(verdict.measured_ms),
            "noise_ms": _finite(verdict.noise_ms),
            "why": verdict.why + (f"; the budget was spent after {len(base) + len(best)} trials" if stopped else ""),
            "trials": [m.run_dir.name for m in (*base, *best)],
        }
        return self.summary(setting, best)

    def judge(
        self, base_setting: Setting, candidate: Candidate, base: list[Measured], cand: list[Measured], stopped: bool
    ) -> tuple[dict, bool]:
        verdict = self.verdict(base_setting, base_setting.with_fix(candidate), base, cand)
        keep, why = verdict.result == trial_rules.FASTER, verdict.why
        base_loss = _median([m.loss for m in base])
        # One trial's NaN loss is the fix's (a median would sort it anywhere): it rejects the fix.
        cand_loss = _median([m.loss for m in cand]) if all(math.isfinite(m.loss) for m in cand) else math.nan
        if keep and candidate.changes_training and not (cand_loss <= LOSS_LIMIT * base_loss):
            keep = False
            why = (
                f"{why}; rejected: its loss after the same images is {cand_loss:.4g} against the baseline's "
                f"{base_loss:.4g} (NaN, or more than {LOSS_LIMIT - 1:.0%} above)"
            )
        if stopped:
            why = f"{why}; the budget was spent after {len(base) + len(cand)} trials"
        estimate = candidate.estimate_ms
        holds = (
            abs(verdict.measured_ms - estimate) <= max(0.35 * estimate, 3.0)
            if math.isfinite(estimate) and math.isfinite(verdict.measured_ms)
            else None
        )
        if keep and holds is False:
            why = (
                f"{why}; the estimate ({estimate:.3g} ms) is off by more than max(35 %, 3 ms): it comes from the "
                f"profiled baseline's breakdown of one part, the measurement from whole unprofiled steps"
                + (" at another batch size" if "--batch-size" in candidate.options else "")
            )
        entry = {
            "rule": candidate.rule,
            "label": candidate.label,
            "setting": base_setting.with_fix(candidate).document(),
            "step_ms": _finite(_median([m.step_ms for m in cand])),
            "baseline_step_ms": _finite(verdict.baseline_ms),
            "images_per_second": _finite(_median([m.images_per_second for m in cand])),
            "estimate_ms": _finite(estimate),
            "measured_ms": _finite(verdict.measured_ms),
            "noise_ms": _finite(verdict.noise_ms),
            "estimate_holds": holds,
            "result": verdict.result,
            "kept": keep,
            "why": why,
            "loss": _finite(cand_loss) if candidate.changes_training else None,
            "baseline_loss": _finite(base_loss) if candidate.changes_training else None,
            "trials": [str(m.run_dir.name) for m in (*base, *cand)],
        }
        return entry, keep

    def summary(self, setting: Setting, runs: list[Measured]) -> dict:
        images_per_second = _median([m.images_per_second for m in runs])
        return {
            "setting": setting.document(),
            "step_ms": _finite(_median([m.step_ms for m in runs])),
            "images_per_second": _finite(images_per_second),
            "seconds_per_epoch": _finite(self.epoch_images / images_per_second if images_per_second else math.nan),
            "loss": _finite(_median([m.loss for m in runs])),
        }

    def argv(self, setting: Setting) -> list[str]:
        """The user's options with the setting's in place of any the user gave (`--batch-size` ...)."""
        kept: list[str] = []
        skip = False
        for token in self.user_argv:
            if skip:
                skip = False
            elif token in setting.options:
                skip = setting.options[token] is not None  # the user's value goes with it
            else:
                kept.append(token)
        return [*kept, *setting.argv()]

    def command(self, setting: Setting) -> str:
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in setting.env.items())
        return " ".join(filter(None, [env, "devprof run", shlex.join(self.argv(setting))]))

    def write(self) -> Path:
        """tune.json, and report.html beside it."""
        from analysis.render.outputs import write_text_atomically

        write_text_atomically(self.tune_dir / "report.html", render_html(self.document, self.tune_dir.name))
        return write_text_atomically(self.tune_dir / "tune.json", json.dumps(self.document, indent=2) + "\n")


def render_text(document: dict) -> str:
    """The tune as a table: each fix tried, its estimate beside its measured saving, and the default
    setting against the best one, in seconds per epoch."""
    lines = [f"tune: {document['status']}"]
    rows = document.get("trials") or []
    if rows:
        lines.append("| fix | setting | step ms (baseline) | estimate ms | measured ms | noise ms | result | kept |")
        lines.append("|---|---|---:|---:|---:|---:|---|---|")
        start = start_setting().options
        for row in rows:
            # what the fixes set: the start (TensorFlow's own setting) is every row's, and said once below
            options = " ".join(
                f"{flag} {value}" if value is not None else flag
                for flag, value in row["setting"]["options"].items()
                if flag not in start
            )
            env = " ".join(f"{key}={value}" for key, value in row["setting"]["env"].items())
            lines.append(
                f"| {row['rule']} | {' '.join(filter(None, [env, options]))} | {_cell(row['step_ms'])} "
                f"({_cell(row['baseline_step_ms'])}) | {_cell(row['estimate_ms'])} | "
                f"{_cell(row['measured_ms'])} | {_cell(row['noise_ms'])} | {row['result']} | "
                f"{'yes' if row['kept'] else 'no'} |"
            )
        lines += [f"- {row['rule']}: {row['why']}" for row in rows]
    for advice in document.get("advice") or ():
        lines.append(f"- not tried ({advice['rule']}, no setting devprof applies): {advice['advice']}")
    baseline, best = document.get("baseline"), document.get("best")
    if baseline and best:
        lines.append(
            f"seconds per epoch: {_cell(baseline['seconds_per_epoch'])} at the default (TensorFlow's own setting), "
            f"{_cell(best['seconds_per_epoch'])} at the best setting"
        )
        side_by_side = document.get("best_against_default")
        if side_by_side:
            lines.append(
                f"the best against the default, side by side: {side_by_side['result']} ({side_by_side['why']})"
            )
        lines.append(f"best: {best['command']}")
        if best.get("code"):
            lines += ["in your own Keras program:", *(f"    {line}" for line in best["code"].splitlines())]
    return "\n".join(lines)


def render_html(document: dict, title: str) -> str:
    """The tune as one HTML page, in the analysis report's style: the default against the best setting,
    each fix tried with its estimate beside its measured saving, the best as a command and as code."""
    from html import escape

    from analysis.render.html_page import CSP, STYLE

    def cell(value) -> str:
        return f'<td class="num">{escape(_cell(value))}</td>'

    baseline, best = document.get("baseline") or {}, document.get("best") or {}
    body = [f"<header><h1>devprof tune: {escape(title)}</h1><p>status: {escape(document['status'])}</p></header>"]
    if baseline and best:
        body.append(
            "<section><h2>Seconds per epoch</h2><table><tr><th>setting</th><th>s/epoch</th><th>step ms</th>"
            "<th>images/s</th></tr>"
            + "".join(
                f"<tr><td>{name}</td>{cell(row.get('seconds_per_epoch'))}{cell(row.get('step_ms'))}"
                f"{cell(row.get('images_per_second'))}</tr>"
                for name, row in (("default", baseline), ("best", best))
            )
            + "</table>"
            + (
                f"<p>the best against the default, side by side: {escape(side['result'])} ({escape(side['why'])})</p>"
                if (side := document.get("best_against_default"))
                else ""
            )
            + f"<p>best: <code>{escape(best.get('command', ''))}</code></p>"
            + (f"<p>in your own Keras program:</p><pre>{escape(best['code'])}</pre>" if best.get("code") else "")
            + "</section>"
        )
    rows = document.get("trials") or []
    if rows:
        header = "".join(
            f"<th>{name}</th>"
            for name in ("fix", "setting", "step ms", "baseline ms", "estimate ms", "measured ms", "noise ms", "result")
        )
        body.append(
            f"<section><h2>Fixes tried</h2><table><tr>{header}<th>kept</th><th>why</th></tr>"
            + "".join(
                f"<tr><td>{escape(row['rule'])}</td><td>{escape(row.get('label') or '')}</td>{cell(row['step_ms'])}"
                f"{cell(row['baseline_step_ms'])}{cell(row['estimate_ms'])}{cell(row['measured_ms'])}"
                f"{cell(row['noise_ms'])}<td>{escape(row['result'])}</td><td>{'yes' if row['kept'] else 'no'}</td>"
                f"<td>{escape(row['why'])}</td></tr>"
                for row in rows
            )
            + "</table></section>"
        )
    advice = document.get("advice") or []
    if advice:
        body.append(
            "<section><h2>Not tried: no setting devprof applies</h2><ul>"
            + "".join(f"<li>{escape(item['rule'])}: {escape(str(item['advice']))}</li>" for item in advice)
            + "</ul></section>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>devprof tune: {escape(title)}</title><style>{STYLE}</style></head>\n<body><main>\n"
        + "\n".join(body)
        + "\n</main></body></html>\n"
    )


def _whole(value) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def _max_batch(memory) -> float:
    """The largest batch every allocator's measured headroom fits (NaN where none says)."""
    fits = [float(peak.max_batch) for peak in getattr(memory, "allocators", ()) if peak.max_batch == peak.max_batch]
    return min(fits) if fits else math.nan


def _cell(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _analyze(run_dir: Path):
    import analysis

    return analysis.analyze(run_dir)


def _median(values: list[float]) -> float:
    finite = [value for value in values if math.isfinite(value)]
    return statistics.median(finite) if finite else math.nan


def _finite(value: float) -> float | None:
    return round(float(value), 4) if value is not None and math.isfinite(value) else None
