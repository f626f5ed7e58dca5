"""Privacy primitives: pure numpy/scipy (never imports pyspark)."""
