"""One exception hierarchy for sparkpriv.

Every error is meant for a person: it names the input, the value and the fix.
The CLI maps the classes to exit codes (see :data:`EXIT_CODES`).
"""

from __future__ import annotations

__all__ = [
    "SparkPrivError",
    "ParameterError",
    "InputError",
    "SchemaError",
    "OutputExistsError",
    "BudgetExceededError",
    "LedgerError",
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_BAD_INPUT",
    "EXIT_BUDGET_REFUSED",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_BUDGET_REFUSED = 3


class SparkPrivError(Exception):
    """Base class of every error sparkpriv raises on purpose."""

    exit_code = EXIT_FAILURE


class ParameterError(SparkPrivError, ValueError):
    """A parameter is missing, of the wrong type or out of its range.

    Depends on the parameters only: raised before any data is read.
    """

    exit_code = EXIT_BAD_INPUT


class InputError(SparkPrivError, ValueError):
    """The input data cannot be released as it is (empty, unreadable, NaN, complex, ...).

    A fault of the data gets this class on every path (numpy arrays and Spark
    tables alike). Both this and :class:`ParameterError` are ``ValueError``
    subclasses with the same exit code, so ``except ValueError`` catches both.
    """

    exit_code = EXIT_BAD_INPUT


class SchemaError(InputError):
    """A declared column is missing or has the wrong type."""


class OutputExistsError(SparkPrivError):
    """The output path exists and ``overwrite`` was not given."""

    exit_code = EXIT_BAD_INPUT


class LedgerError(SparkPrivError):
    """The budget ledger cannot be opened, read or written."""


class BudgetExceededError(SparkPrivError):
    """The ledger refused a release: it would exceed the table's budget."""

    exit_code = EXIT_BUDGET_REFUSED
