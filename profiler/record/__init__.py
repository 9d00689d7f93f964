"""Recording a run, the same for `devprof run`, `profiler.profile()` and `profiler.KerasCallback`:
the session (`session`), the run directory (`rundir`), the profiler window and step markers
(`tracing`), TensorBoard scalars (`scalars`), a job's run.json (`job`), out-of-memory errors
(`oom`) and the progress lines (`console`)."""
