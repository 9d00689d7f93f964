"""XLA and PjRt (TensorFlow with XLA, JAX): program executions on the host, collectives on devices."""

from analysis.producers import Producer

PRODUCER = Producer(
    name="xla",
    # "PjRtStreamExecutorLoadedExecutable::Execute", "TfrtCpuExecutable::Execute", ... on py_xla_execute threads.
    host_execution=r"^\w*Executable::Execute\w*$",
    program=r"^\w*(?:Executable|PjRt\w*)::Execute(?:Sharded|Portable)?$",
    collective=r"all-?reduce|all-?gather|reduce-?scatter|all-?to-?all|collective-?permute|collective-?broadcast",
    compile=r"^(?:\w*PjRt\w*::Compile\w*|XlaCompile\w*|HLO passes.*|\w*Compiler::\w+)$",
)
