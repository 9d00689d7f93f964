"""TensorFlow's executor, eager runtime, tf.function and tf.data (host events)."""

from analysis.producers import Producer

PRODUCER = Producer(
    name="tensorflow",
    # The iterator op, eager or in a graph ("scope/IteratorGetNext:IteratorGetNext").
    host_input=r"^(?:IteratorGetNext|InfeedEnqueue)|:(?:IteratorGetNext\w*|InfeedEnqueue\w*)$",
    compile=r"^(?:tf\.function-graph_building|XlaCompile\w*|TfrtCompile\w*|\w*CompilationCache\w*|\w*Compiler::\w+"
    r"|HLO passes.*)$",
    host_execution=r"^(?:KernelAndDevice\w*::Run|ExecutorState::Process|ExecutorDoneCallback|ThunkExecutor::Execute)$",
    eager_wrapper=r"^(?:EagerExecute|EagerLocalExecute|EagerKernelExecute|FunctionRun)",
    # Collective ops on the host (MultiWorkerMirroredStrategy on CPUs): the step waits for its peers there.
    collective=r"Collective(?:Reduce|Gather|Bcast|AllToAll|Permute)\w*|NcclAllReduce",
    # tf.profiler.experimental.Trace("train", step_num=N, _r=1) in custom loops.
    step_markers=("train",),
    # Ops that make the host wait for the device's output inside a step.
    host_sync=r"(?:^|:)(?:PrintV2|StringFormat)$",
)

# Host events carrying this stat are Python-level tf.function calls ("traced-..." when the
# call traced the function first).
FUNCTION_CALL_STAT = "tf_function_call"
# The concrete function a call ran, named inside it ("EagerLocalExecute: __inference_step_233").
CONCRETE_FUNCTION = r"(__inference_\w+)"
# tf.data's own functions and threads: never a training step.
INPUT_PIPELINE_FUNCTION = r"Dataset|tf_data"
# A TF op event is named "scope/op_name:OpType" (XProf's ParseTfOpFullname).
TF_OP = r"^[^\s:][^:]*:[A-Za-z_][A-Za-z0-9_]*$"

# Roots of event groups that are not training steps: evaluation, prediction, summaries, callbacks.
NOT_A_TRAINING_STEP = (
    r"test_function|eval(?:uate)?_?(?:step|function)|predict_(?:step|function)|summary|"
    r"on_(?:train|test|predict)_(?:batch|epoch)_(?:begin|end)|callback"
)

# tf.data: one `Iterator::` event per stage and batch ("Iterator::Root::Prefetch::Map").
INPUT_STAGE = r"^Iterator::"
INPUT_ROOT = "Iterator::Root"
INPUT_PREFETCH = r"(?:^|::)Prefetch(?:\[\d+\])?(?:::|$)"
# tf.distribute's multi-device iterator handing out a batch.
INPUT_SHARD = r"^GetNextFromShard"
# Python inside the pipeline (tf.py_function, tf.numpy_function): holds the GIL.
PY_FUNCTION = r"(?:^|:)(?:EagerPyFunc|PyFunc|PyFuncStateless|NumpyFunction)$"

# One op or tf.function executed from Python, one call at a time ("EagerLocalExecute: MatMul"); a
# tf.function call names its concrete function ("EagerLocalExecute: __inference_step_233").
EAGER_EXECUTION = r"^EagerLocalExecute: (\S+)$"
# The iterator's own ops, which every loop that calls next() runs eagerly: input, not eager work.
ITERATOR_OP = r"Iterator|^Optional(?:FromValue|HasValue|GetValue|None)$|^DatasetCardinality$"

# The host events XProf counts as op time (its ParseTfOpFullname): "name:Type" ops, in its own
# character sets for name and type; tf.data's `Iterator::` stages; the host's memcpy events.
XPROF_TF_OP = r"^[A-Za-z0-9.][A-Za-z0-9_./>-]*:[A-Z_][A-Za-z0-9_]*$"
XPROF_HOST_OP = XPROF_TF_OP + r"|^Iterator:|^(?i:memcpy(?:htod|dtoh))[^:]*$"
# The eager runtime's call, above an op or a tf.function's run, that XProf's grouping takes to say
# an op ran eagerly (its `is_func` stat 0: one op, not a tf.function; the only name it maps there).
EAGER_CALL = r"^EagerExecute$"

# The allocators' own events on the host plane, one per allocation and deallocation, each naming its
# allocator (`GPU_0_bfc`, `gpu_host_bfc`, `mklcpu`, `cpu`, ...): XProf's Memory Profile reads them.
MEMORY_ALLOCATION = "MemoryAllocation"
MEMORY_DEALLOCATION = "MemoryDeallocation"
# TensorFlow's DataType numbers (types.proto) as TensorFlow names them (DataTypeString), for the
# allocation events' `data_type` stat; 0 (a deallocation's) is no type.
DATA_TYPES = {
    1: "float",
    2: "double",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    8: "complex64",
    9: "int64",
    10: "bool",
    11: "qint8",
    12: "quint8",
    13: "qint32",
    14: "bfloat16",
    15: "qint16",
    16: "quint16",
    17: "uint16",
    18: "complex128",
    19: "half",
    20: "resource",
    21: "variant",
    22: "uint32",
    23: "uint64",
    24: "float8_e5m2",
    25: "float8_e4m3fn",
    26: "float8_e4m3fnuz",
    27: "float8_e4m3b11fnuz",
    28: "float8_e5m2fnuz",
    29: "int4",
    30: "uint4",
}
