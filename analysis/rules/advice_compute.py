"""The rules' sentences about the step's math: precision (only where a measured ceiling says it is
faster), XLA, a larger batch, oneDNN's kernels and the ops far below their roofline, each in the words
of the program that wrote the trace. Only the rows (`bound_rules`, `finding_rules`) say which
sentence goes with which rule.
"""

from __future__ import annotations

import re

from analysis.breakdown.roofline import BelowRoofline
from analysis.rules import programs as program_facts
from analysis.rules import savings
from analysis.rules.devices import facts_for
from analysis.rules.facts import Facts, make_facts

LARGER_BATCH_ADVICE = (
    "A larger batch (`--batch-size`) uses the device better if memory allows; otherwise a faster device "
    "or a smaller model is what helps."
)
MIXED_FOR_DTYPE = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def compute_advice(
    device: str = "",
    precision: str | None = None,
    jit_compile: bool | None = None,
    producer: str = "devprof",
    bfloat16_units: tuple[str, ...] | None = None,
) -> list[str]:
    """What to try on a compute-bound step, leaving out what the run already does, in the
    words of the program that wrote the trace."""
    return _compute_advice(
        make_facts(
            input_pct=None,
            host_pct=None,
            device=device,
            precision=precision,
            jit_compile=jit_compile,
            producer=producer,
            bfloat16_units=bfloat16_units,
        )
    )


def precision_advice(facts: Facts) -> str | None:
    """Mixed precision only where the measured ceiling of that dtype beats the run's; back to float32
    where the run's reduced dtype measures slower; a measurement to take where neither is known."""
    device = facts_for(facts.device)
    now, other = savings.precision_dtypes(facts)
    ratio = savings.precision_ratio(facts)
    if now != "float32":
        if ratio == ratio and ratio > 1.0:
            return (
                f"Go back to float32 ({_precision_change(facts, 'float32')}): its measured ceiling is higher here, "
                f"{savings.ceilings_text(facts)}."
            )
        if ratio != ratio and _bfloat16_emulated(facts.precision or "", facts.bfloat16_units):
            return f"Go back to float32 ({_precision_change(facts, 'float32')}): this CPU has no bfloat16 units."
        return None
    if ratio == ratio:
        if ratio > 1.0:
            return (
                f"Use mixed precision: {program_facts.precision(facts.producer, device.mixed_precision)}; "
                f"{savings.ceilings_text(facts)}."
            )
        return f"Keep float32: {savings.ceilings_text(facts)}, so {device.mixed_precision} would be slower here."
    if _bfloat16_emulated(device.mixed_precision, facts.bfloat16_units):
        return (
            "Keep float32: this CPU has no bfloat16 units (no AVX512-BF16, no AMX), so mixed_bfloat16 "
            "would be emulated and slower."
        )
    note = f" ({device.precision_note})" if device.precision_note else ""
    return (
        f"Whether {device.mixed_precision} would be faster is a guess until measured{note}: `devprof peak` "
        f"measures {other}'s and float32's ceilings on this device; switch "
        f"({program_facts.precision(facts.producer, device.mixed_precision)}) only if {other}'s is higher."
    )


def _precision_change(facts: Facts, dtype: str) -> str:
    if facts.producer == "devprof":
        return f"`--precision {dtype}`"
    if dtype == "float32":
        return "no mixed-precision policy" if facts.producer != "jax" else "float32 parameters and activations"
    return program_facts.precision(facts.producer, f"mixed_{dtype}")


def _compute_advice(facts: Facts) -> list[str]:
    device = facts_for(facts.device)
    program = program_facts.program(facts.producer)
    jit_compile = facts.jit_compile
    advice = [line for line in [precision_advice(facts)] if line]
    if device.xla_helps and not jit_compile and program.xla:
        how = "`--jit-compile` (`tf.function(jit_compile=True)`)" if program.name == "devprof" else program.xla
        advice.append(f"Compile the step with XLA: {how}.")
    if program.name == "devprof":
        return advice + [LARGER_BATCH_ADVICE]
    how = "" if program.batch_size == "a larger batch" else f" ({program.batch_size})"
    return advice + [
        f"A larger batch{how} uses the device better if memory allows; otherwise a "
        "faster device or a smaller model is what helps."
    ]


def _bfloat16_emulated(policy: str, bfloat16_units: tuple[str, ...] | None) -> bool:
    """Whether the suggested policy is bfloat16 on a CPU known to lack bfloat16 units."""
    return policy == "mixed_bfloat16" and bfloat16_units == ()


def _compute_fix(facts: Facts) -> str:
    device = facts_for(facts.device)
    at_peak = (
        f"{facts.mfu_scope} at {facts.mfu_pct:.0f} % of the device's {facts.peak_dtype} ceiling; "
        if facts.mfu_pct == facts.mfu_pct
        else ""
    )
    now, _ = savings.precision_dtypes(facts)
    ratio = savings.precision_ratio(facts)
    slower_now = now != "float32" and (
        ratio > 1.0 if ratio == ratio else _bfloat16_emulated(facts.precision or "", facts.bfloat16_units)
    )
    if slower_now:
        return f"{at_peak}go back to float32 ({_precision_change(facts, 'float32')}): {_slower_dtype_reason(facts)}"
    # Mixed precision only where its measured ceiling is higher.
    faster = now == "float32" and ratio == ratio and ratio > 1.0
    program = program_facts.program(facts.producer)
    if facts.producer != "devprof":
        tries = [program_facts.precision(facts.producer, device.mixed_precision)] if faster else []
        if device.xla_helps and not facts.jit_compile and program.xla:
            tries.append(program.xla)
        return f"{at_peak}try {', '.join(tries + [program.batch_size])}, or a faster device"
    tries = [f"--precision {device.mixed_precision}"] if faster else []
    if device.xla_helps and not facts.jit_compile:
        tries.append("--jit-compile")
    already = f"already {facts.precision}; " if now != "float32" else ""
    return f"{at_peak}{already}try {' and '.join(tries + ['a larger --batch-size'])}, or a faster device"


def _slower_dtype_reason(facts: Facts) -> str:
    ratio = savings.precision_ratio(facts)
    if ratio == ratio:
        return f"{savings.ceilings_text(facts)}"
    return "this CPU has no bfloat16 units (no AVX512-BF16, no AMX), so bfloat16 is emulated"


def _compute_words(facts: Facts) -> str:
    kind = facts_for(facts.device).kind
    return (
        "the device's kernels" if kind in ("gpu", "tpu") else "TensorFlow's ops" if kind == "cpu" else "the step's ops"
    )


def _si_rate(value: float) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}FLOP/s"
    return f"{value:.3g} FLOP/s"


# oneDNN's brgemm-based implementations (brg_conv_fwd:avx2, brg_conv_bwd_w:avx512_core, brg:avx512_core_amx,
# brgemm_matmul:...): its fastest convolution and matmul kernels.
BRGEMM_RE = re.compile(r"^brg")
KERNEL_NAME_SHOWN = 60  # generated kernel names run to hundreds of characters; the op table has them whole


def _roofline_headline(facts: Facts) -> str:
    ops = facts.below_roofline
    first = ops[0]
    roof = "compute" if first.bound == "compute" else "memory-bandwidth"
    kernel = first.kernel if len(first.kernel) <= KERNEL_NAME_SHOWN else f"{first.kernel[: KERNEL_NAME_SHOWN - 1]}…"
    kernel = f", {kernel}" if kernel else ""
    lead = (
        f"{first.name} ({first.type}, {first.dtype}{kernel}) runs at {first.ceiling_pct:.0f} % of its {roof} "
        f"ceiling ({_si_rate(first.flops_per_second)}) and holds {first.share_pct:.0f} % of op time "
        f"({first.ms_per_step:.2f} ms per step)"
    )
    more = "; ".join(
        f"{op.name} {op.ceiling_pct:.0f} % of its ceiling, {op.share_pct:.0f} % of op time" for op in ops[1:]
    )
    return f"{lead}{'; also ' + more if more else ''}."


def _roofline_fix(facts: Facts) -> str:
    """The change that fits why the op is far under its ceiling."""
    op: BelowRoofline = facts.below_roofline[0]
    program = program_facts.program(facts.producer)
    if op.kind == "vector" or op.bound == "memory":
        xla = "--jit-compile" if facts.producer == "devprof" else (program.xla or "XLA")
        return f"fuse the memory-bound elementwise work with XLA ({xla}): one pass over memory instead of one per op"
    if facts.device == "cpu":
        if op.kernel == "Eigen":
            return "set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported: oneDNN's kernels are faster"
        ratio = savings.precision_ratio(facts)
        measured_faster = (
            savings.precision_dtypes(facts)[0] == "float32"
            and op.dtype in ("", "float32")
            and ratio == ratio
            and ratio > 1.0
        )
        wide = bool(facts.bfloat16_units) or bool(facts.matrix_units)  # AVX-512 BF16 or AMX: brgemm kernels exist
        faster = (
            f"bfloat16 ({_precision_change(facts, 'bfloat16')}: {savings.ceilings_text(facts)})"
            if measured_faster
            else "a faster device"
            if wide
            else "a CPU with AVX-512 or AMX, where oneDNN has faster (brgemm) kernels for it"
        )
        op_type = re.sub(r"^_(Mkl)?(Native)?", "", op.type)
        implementation = op.kernel.removeprefix("oneDNN").strip()  # "oneDNN jit:avx2": named by its log
        if not implementation:
            log = (
                "`devprof run --onednn-kernels`"
                if facts.producer == "devprof"
                else "`ONEDNN_VERBOSE=1` in the environment"
            )
            return (
                f"which oneDNN kernel ran this {op_type} was not recorded ({log} logs it; brgemm kernels are the "
                f"fast kind): try a larger batch, or {faster}"
            )
        if BRGEMM_RE.search(implementation):
            return (
                f"oneDNN ran this {op_type} with {implementation}, a brgemm kernel, its fastest kind on this CPU: "
                f"try a larger batch, or {faster}"
            )
        if wide:
            return (
                f"oneDNN ran this {op_type} with {implementation}, not one of the brgemm kernels (brg_conv_*, "
                "brg:*) this CPU has: its shapes may not fit them; try channels in multiples of 16 and a larger "
                f"batch, or {faster}"
            )
        return (
            f"oneDNN ran this {op_type} with {implementation}, not one of its brgemm kernels (brg_conv_*, "
            f"brg:*), which are the fast ones: this CPU has none for it (an AVX2 CPU falls back to jit:avx2 for "
            f"backward weights; AVX-512 and AMX CPUs have brgemm ones); try a larger batch, or {faster}"
        )
    if op.dtype == "float32" and facts.matrix_units:
        return (
            f"{op.dtype} does not use the device's {'/'.join(facts.matrix_units)} matrix units: train with "
            f"{MIXED_FOR_DTYPE.get(facts.matrix_units[-1], 'mixed precision')}"
        )
    return (
        "give each kernel more work: a larger batch, and matrix dimensions (channels, features) that are "
        "multiples of 64 so the matrix units' tiles are full; for convolutions, channels-last layout so no "
        "transposes run around them"
    )


def _slower_dtype(facts: Facts) -> bool:
    now, _ = savings.precision_dtypes(facts)
    if now == "float32":
        return False
    ratio = savings.precision_ratio(facts)
    return ratio > 1.0 if ratio == ratio else _bfloat16_emulated(facts.precision or "", facts.bfloat16_units)


def _matrix_units_fix(facts: Facts) -> str:
    policy = MIXED_FOR_DTYPE[(facts.matrix_units or ("",))[-1]]
    how = f"--precision {policy}" if facts.producer == "devprof" else program_facts.precision(facts.producer, policy)
    dtype = policy.removeprefix("mixed_")
    ratio = facts.matrix_ceiling(dtype) / facts.matrix_ceiling("float32")
    if ratio == ratio:
        return f"train with {how} ({dtype} {ratio:.1f}x float32's measured matrix ceiling)"
    return (
        f"measure {dtype}'s ceiling against float32's (`devprof peak`); where it is higher, train with {how} "
        "(from the device's datasheet alone this is a guess)"
    )
