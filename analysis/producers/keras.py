"""Keras: the TensorBoard callback's `profile_batch` marker."""

from analysis.producers import Producer

PRODUCER = Producer(name="keras", step_markers=("Profiled batch",))
