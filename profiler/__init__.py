"""devprof's recording side. The public API for any training loop:

    import profiler

    with profiler.profile("runs", run_name="my-job") as session: ...   # any loop
    model.fit(..., callbacks=[profiler.KerasCallback("runs")])         # Keras

`import profiler` does not import TensorFlow; the names below load on first use.
"""

_PUBLIC = {
    "profile": "profiler.api",
    "ProfileSession": "profiler.api",
    "KerasCallback": "profiler.keras_callback",
    "Terminated": "profiler.record.session",
    "RunExistsError": "profiler.record.rundir",
    "OutputError": "profiler.record.rundir",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
