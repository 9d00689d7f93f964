"""Steps: where a worker's steps come from (a trace, else steps.csv), how they are found, and
each step cut into parts on the host and on every device."""
