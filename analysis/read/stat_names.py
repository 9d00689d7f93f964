"""The event stats `read_trace` decodes, by name: here, without pandas, so that a trace's decoding can
begin before pandas is imported (`xplane_wire.begin`)."""

# Stats copied into columns of the events table because the analyses key on them.
EVENT_STAT_COLUMNS = (
    "step_num",
    "_r",
    "steps",
    "group_id",
    "_p",
    "_c",
    "tf_function_call",
    "iter_num",
    "correlation_id",
    "tf_op",  # on device kernels: the framework op that launched them ("name:Type", "XlaModule:" for JAX)
    "hlo_op",
    "module_name",  # on host program executions (XLA's ExecuteThunks): which program ran
    "program_id",  # on device kernels of XLA programs
    "level 0",  # on device kernels of TensorFlow up to about 2.5: what `tf_op` says in later ones
    "is_eager",  # on ops and kernels, where the profiler grouped events at capture (TensorFlow up to about 2.5)
    "is_func",  # on `EagerExecute`: 1 where the call ran a tf.function, 0 an op
)
# Of those, the ones read as numbers (nullable floats) and as ids (nullable uint64); the others are texts.
NUMERIC_STAT_COLUMNS = ("step_num", "_r", "steps", "group_id", "iter_num", "program_id", "is_eager", "is_func")
ID_STAT_COLUMNS = ("_p", "_c", "correlation_id")
# Stats of the allocators' events (TensorFlow's MemoryAllocation / MemoryDeallocation), read in the same
# pass into `Trace.memory`, one row per event that names its allocator, not into a column of every event;
# their op is the `tf_op` column, their group `group_id`. Texts: the allocator, region and shape. PJRT's
# allocators (JAX on TPUs) name no allocator: their device is `index_on_host` (or `device_ordinal`).
MEMORY_STAT_COLUMNS = (
    "allocator_name",
    "index_on_host",
    "device_ordinal",
    "bytes_reserved",
    "bytes_allocated",
    "bytes_available",
    "peak_bytes_in_use",
    "requested_bytes",
    "allocation_bytes",
    "fragmentation",
    "addr",
    "region_type",
    "data_type",
    "shape",
)
MEMORY_TEXT_STATS = ("allocator_name", "region_type", "shape")
MEMORY_KEY_STATS = ("allocator_name", "index_on_host", "device_ordinal")  # an allocator event states one of them

# What read_trace asks the decoder for: the stats to keep, and those of them read as numbers.
READ_STATS = EVENT_STAT_COLUMNS + MEMORY_STAT_COLUMNS
READ_NUMBERS = (
    NUMERIC_STAT_COLUMNS + ID_STAT_COLUMNS + tuple(c for c in MEMORY_STAT_COLUMNS if c not in MEMORY_TEXT_STATS)
)
