"""The decisions, as pure functions of state: placement, reconcile, autoscale, LoRA adapters.

No I/O, no clocks read, no tasks: every input (catalog, nodes, records, now)
is an argument, so tests and benchmarks call them directly. May import
:mod:`..spec`, :mod:`..state` and record types of :mod:`..store`.
"""
