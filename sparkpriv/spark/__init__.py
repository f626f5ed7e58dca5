"""Layer 2: runs the numpy core over Spark DataFrames (Arrow batches)."""
