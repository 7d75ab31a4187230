"""The vocabulary every layer shares: symbolic values, dtypes, dynamic sizes, tolerances,
progress, the model's calling convention, and what both targets write and compare with.

Nothing here imports a front end, a rule, a target or the pipeline (tests/test_layering.py).
"""
