"""`shardfeed bench`: where an epoch's time goes -- `model.fit`, `shardfeed.fit`, the floor.

A benchmark, not a test (`tests/_commands/test_bench.py` only checks that it runs);
every report records the machine, versions and repeat counts it was measured
under. This `__init__` imports nothing: `shardfeed demo` imports `workloads`
alone, and `shardfeed launch` never pays for TensorFlow.
"""
