"""Offline random test checkpoints in the official layouts (tests, benchmarks, the demo).

Production code never imports this package: ``voxcast make-test-model`` and the test fixtures do.
"""
