"""How each kind of training program says a change, in one table.

The same fix reads differently in devprof's own loop (a command-line flag), Keras `fit`
(`model.compile(...)`), a custom TensorFlow loop (its `tf.function`) and JAX (`jax.jit`);
advice lines ask this table, never name a flag themselves, so a JAX program is never told
to pass `--steps-per-execution`. The program comes from `Facts.producer`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProgramFacts:
    name: str
    steps_per_call: str  # "{k}": run k steps per call of the step function
    precision: str  # "{policy}": a mixed-precision policy such as mixed_float16
    xla: str  # compile the step with XLA ("" where it always is)
    batch_size: str
    input_pipeline: str  # "tf.data" or "" where the pipeline is the program's own


PROGRAMS = {
    "devprof": ProgramFacts(
        "devprof",
        "`--steps-per-execution {k}`",
        "`--precision {policy}`",
        "`--jit-compile`",
        "`--batch-size`",
        "tf.data",
    ),
    "keras": ProgramFacts(
        "keras",
        "`model.compile(..., steps_per_execution={k})`",
        '`keras.mixed_precision.set_global_policy("{policy}")`',
        "`model.compile(..., jit_compile=True)`",
        "a larger `batch_size` in `fit`",
        "tf.data",
    ),
    "tensorflow": ProgramFacts(
        "tensorflow",
        "{k} steps inside one `tf.function` call (a `tf.range({k})` loop over the iterator)",
        '`keras.mixed_precision.set_global_policy("{policy}")`',
        "`tf.function(jit_compile=True)` on the step",
        "a larger batch",
        "tf.data",
    ),
    "jax": ProgramFacts(
        "jax",
        "{k} steps inside one jitted call (`jax.lax.scan` or `jax.lax.fori_loop` over the steps)",
        "{policy_dtype} parameters and activations (e.g. `jmp` policies or `dtype=jnp.{policy_dtype}` layers)",
        "",
        "a larger batch",
        "",
    ),
}
UNKNOWN = ProgramFacts(
    "unknown",
    "{k} steps per call of the step function",
    "mixed precision ({policy})",
    "XLA compilation of the step",
    "a larger batch",
    "",
)


def program(producer: str | None) -> ProgramFacts:
    return PROGRAMS.get(producer or "", UNKNOWN)


def steps_per_call(producer: str | None, k: int) -> str:
    return program(producer).steps_per_call.format(k=k)


def precision(producer: str | None, policy: str) -> str:
    dtype = policy.removeprefix("mixed_")
    return program(producer).precision.format(policy=policy, policy_dtype=dtype)


def float32(producer: str | None) -> str:
    """How a program that computes in float64 goes back to float32."""
    if producer == "jax":
        return 'float32 arrays (`jax.config.update("jax_enable_x64", False)`, or `.astype(jnp.float32)` on the data)'
    if producer == "devprof":
        return "a model and data in float32 (`--precision float32`)"
    return (
        '`keras.backend.set_floatx("float32")` before the model is built, and float32 data '
        "(`tf.cast(x, tf.float32)` in the pipeline)"
    )
