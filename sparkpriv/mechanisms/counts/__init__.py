"""DP counts per public key for event tables (docs/math.md section 9; docs/counts.md).

The question asked most often of call-detail and transit data: how many
distinct people used each tower (per hour), how many trips between two
stations. The release is one noisy value for EVERY key of a declared public
domain, including keys no one visited:

* a **key** is one or more declared columns (:class:`KeyDomain`): the product
  of per-column vocabularies (towers; towers x hours of the day) or an explicit
  list of key tuples (declared origin-destination pairs). Events at keys
  outside the domain are dropped and counted for the owner only;
* **person-level bounding** (:mod:`sparkpriv.mechanisms.sparse`): at most
  ``L = max_keys`` keys per person (the keyed uniform choice) and, optionally,
  the person's events per key capped at ``c = max_events_per_key``; the value
  counted at a key is then the capped event count (1 per person without ``c``:
  distinct people);
* **noise**: discrete Laplace (pure epsilon, L1 sensitivity) or discrete
  Gaussian (L2 sensitivity), from :mod:`sparkpriv.privacy.noise`, drawn once
  on the driver for the whole domain.

Sensitivity (``d`` keys, ``m`` = the most keys one neighbour changes)::

    add-remove:  m = min(L, d)        replace-one:  m = min(2 L, d)
    L1 = m c                          L2 = c sqrt(m)        (c = 1 without a cap)

(records are non-negative, so replace-one moves a record by ``c sqrt(2L)`` in
L2, not ``2 c sqrt(L)``; ``tests/mechanisms/test_counts.py`` checks every
bound by brute force over all records of small domains).

Exact lattice output. The noise is integer noise ``N`` on the power-of-two
grid ``g`` of the calibration; the exact mechanism output is the lattice value
``v = count + g N``. A count can need 33 bits and ``g N`` 56 bits below the
point, more than an int64 or a double holds, so ``v`` is kept as the pair
``(A, r)`` with ``A = count + floor(g N)`` and ``r = N mod 2^s`` (``g =
2^-s``), computed in int64 without rounding; ``(A, r)`` determines ``v`` and
back, so the float ``A + r g`` written to the table (and the rounded integer,
the clamp, the interval) is post-processing of ``v``.

This module is the numpy core: no pyspark, no I/O.

The package's modules, in import order (each imports only those before it; this module re-exports
their names, so ``from sparkpriv.mechanisms import counts`` is the one way in):

- ``_keys``: the public key domain (:class:`KeyDomain`), :class:`CountsParams` and the
  sensitivities;
- ``_plan``: the plan made before any data (:class:`CountsPlan`, :func:`plan_counts`), the
  noise on the lattice and its uncertainty, the in-memory counts (:func:`finalize_counts`);
- ``_mechanism``: the mechanism of the release protocol (:class:`Counts`), on any engine.
"""

from __future__ import annotations

from sparkpriv.mechanisms.counts._keys import (NOISE_KINDS, NEIGHBORS, MAX_COUNT, DRIVER_KEYS, BLOCK_KEYS,
                                               MAX_DRIVER_KEYS, MAX_KEYS, _POS, KeyDomain, _is_int, CountsParams,
                                               sensitivities)
from sparkpriv.mechanisms.counts._plan import (CountsPlan, plan_counts, _check_grid, _grid_shift, _outside_prob,
                                               uncertainty, _upper_tail, count_keys, noise_integers,
                                               lattice_values, CountsResult, finalize_counts, noisy_values)
from sparkpriv.mechanisms.counts._mechanism import (CountsReleaseParams, _CountsState, _totals_fn, Counts,
                                                    OUTPUT_COLUMNS, _key_type, COUNTS)

__all__ = [
    "NOISE_KINDS",
    "NEIGHBORS",
    "MAX_COUNT",
    "DRIVER_KEYS",
    "BLOCK_KEYS",
    "MAX_DRIVER_KEYS",
    "MAX_KEYS",
    "KeyDomain",
    "CountsParams",
    "CountsPlan",
    "plan_counts",
    "sensitivities",
    "count_keys",
    "noise_integers",
    "lattice_values",
    "finalize_counts",
    "noisy_values",
    "CountsResult",
]
