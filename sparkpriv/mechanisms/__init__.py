"""Mechanisms on in-memory arrays: pure numpy/scipy (never imports pyspark)."""
