"""Keras: the TensorBoard callback's `profile_batch` marker, and the functions `fit`,
`evaluate` and `predict` run once per step."""

import re

from analysis.producers import Producer

PRODUCER = Producer(name="keras", step_markers=("Profiled batch",))

# The tf.function Keras' `fit` calls once per step (or per `steps_per_execution` steps):
# Keras 2 names it `train_function` (its concrete function `__inference_train_function_N`).
# Its host span, and the step group TensorFlow records inside it (`group_id`, the executed
# function's `_r` root), is Keras' own step on every device.
TRAIN_FUNCTION = re.compile(r"(?:^|_)train_function(?:_\d+)?$")
# `evaluate` and `predict` steps: their groups are not training steps.
OTHER_FUNCTION = re.compile(r"(?:^|_)(?:test|predict)_function(?:_\d+)?$")
