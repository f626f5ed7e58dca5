"""sparkpriv: differentially private releases of large tables on Apache Spark.

Public API (imported lazily so that ``import sparkpriv.privacy`` never starts
or imports Spark):

* :func:`release_projection` (Spark DataFrames, event records, or in-memory
  arrays and tables; ``release_projection_array`` is the same function),
  :func:`recover_sq_distances`
* :func:`release_dprp` (DPRP private table: Spark DataFrames, event records, or
  in-memory arrays and tables; ``release_dprp_array`` is the same function),
  :func:`table_arrays` (the released features and labels back as numpy arrays)
* :func:`release` (any registered mechanism, either engine), :func:`release_kmeans`
  (Spark DataFrames, event records, or in-memory arrays and tables;
  ``release_kmeans_array`` is the same function), :class:`KMeansModel`
* :func:`release_counts` (DP counts per public key of bounded event records)
* :func:`release_synthetic` (a DP synthetic person x item table of an event table or an
  in-memory 0/1 matrix; ``model.sample(n, seed)``)
* :func:`release_aggregates` and the builder :class:`Aggregates` (DP count, count_distinct, sum,
  mean, variance and quantiles per key of an event table)
* :func:`open_ledger` (privacy-budget ledger), :func:`read_table` (a source
  table as the CLI reads it; local Parquet read this way lets aggregate
  passes scan the files directly)
* errors: :class:`SparkPrivError` and subclasses
"""

from sparkpriv._version import __version__
from sparkpriv.errors import (
    BudgetExceededError,
    InputError,
    LedgerError,
    OutputExistsError,
    ParameterError,
    SchemaError,
    SparkPrivError,
)

_LAZY = {
    "release_projection": "sparkpriv.api",
    "release_projection_array": "sparkpriv.api",
    "recover_sq_distances": "sparkpriv.mechanisms.projection",
    "release_dprp": "sparkpriv.api",
    "release_dprp_array": "sparkpriv.api",
    "table_arrays": "sparkpriv.api",
    "release": "sparkpriv.api",
    "release_kmeans": "sparkpriv.api",
    "release_kmeans_array": "sparkpriv.api",
    "release_regression": "sparkpriv.api",
    "release_counts": "sparkpriv.api",
    "release_dpgm": "sparkpriv.api",
    "release_synthetic": "sparkpriv.api",
    "release_aggregates": "sparkpriv.api",
    "Aggregates": "sparkpriv.api",
    "KMeansModel": "sparkpriv.mechanisms.kmeans_model",
    "open_ledger": "sparkpriv.ledger",
    "get_spark": "sparkpriv.spark.session",
    "read_table": "sparkpriv.io.inputs",
}

__all__ = [
    "__version__",
    "SparkPrivError",
    "ParameterError",
    "InputError",
    "SchemaError",
    "OutputExistsError",
    "BudgetExceededError",
    "LedgerError",
    *_LAZY,
]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'sparkpriv' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
