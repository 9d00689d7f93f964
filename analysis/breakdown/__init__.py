"""Breakdown: what the steps are made of, per device, per op, per tf.data stage, per epoch, per
sampler and per worker. Pure functions of the trace view and the steps."""
