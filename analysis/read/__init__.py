"""Read: the run's files and its trace, each read once (`read_inputs`), and the trace's events
split once into the host and device tables every later stage queries (`TraceView`)."""
