"""Deterministic orchestration: no I/O, no clocks, no randomness. Side effects are activities."""
