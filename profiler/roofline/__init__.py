"""The two sides of the roofline that `analysis/` draws: the device's measured ceilings (`peak`,
cached per device) and the FLOPs and bytes of each op the program traced (`op_costs`)."""
