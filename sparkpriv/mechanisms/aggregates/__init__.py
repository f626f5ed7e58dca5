"""DP aggregates per key of an event table (docs/aggregates.md; mathematics: docs/math.md section 11).

Per key (one or more columns over a public domain, or selected privately): ``count`` (events),
``count_distinct`` (people), ``sum``, ``mean``, ``variance`` and ``quantile`` of value columns, any
several at once, from one pass over the events. Each person contributes at most ``L`` keys and,
at a key, at most ``c`` events' worth (their events weighted ``min(n, c) / n``); each value column
is clamped to a declared ``[lo, hi]`` (or one chosen by a DP quantile). A few statistics per key
(people, events, centred sums, centred sums of squares, histograms) get discrete Laplace or
Gaussian noise once each; every cell is post-processing of them and carries its std and an
interval of stated coverage. Numpy only: no pyspark, no I/O.

The package's modules, in import order (this module re-exports their names):

- ``_query``: aggregates, clamps, the measured groups and their sensitivities;
- ``_plan``: the budget split, noise, key-selection threshold and quantile bands;
- ``_stats``: the per-block bounding and per-key totals;
- ``_estimate``: the noise and the released cells with their intervals;
- ``_params``: the public parameters and what the engine opens;
- ``_mechanism``: the mechanism of the release protocol (:class:`Aggregates`).
"""

from __future__ import annotations

from sparkpriv.mechanisms.aggregates._query import (KINDS, GROUP_KINDS, Aggregate, Group, parse_aggregates,
                                                    parse_clamps, parse_split, groups_of, group_bound,
                                                    group_sensitivity, output_columns)
from sparkpriv.mechanisms.aggregates._plan import (MAX_PEOPLE_PER_KEY, Calibration, Selection, AggregatesPlan,
                                                   plan_aggregates, split_weights, quantile_band)
from sparkpriv.mechanisms.aggregates._stats import (Bounding, DIAGNOSTICS, key_totals, auto_histograms,
                                                    clamp_candidates, bucket_of)
from sparkpriv.mechanisms.aggregates._estimate import add_group_noise, cells, selected
from sparkpriv.mechanisms.aggregates._params import (NOISE_KINDS, AggregatesParams, EventSpec, Query,
                                                     resolve_domain, table_specs, DEFAULT_MAX_DOMAIN,
                                                     MAX_DRIVER_CELLS)
from sparkpriv.mechanisms.aggregates._mechanism import AGGREGATES, Aggregates, choose_clamp

__all__ = [
    "KINDS", "GROUP_KINDS", "Aggregate", "Group", "parse_aggregates", "parse_clamps", "parse_split", "groups_of",
    "group_bound", "group_sensitivity", "output_columns", "MAX_PEOPLE_PER_KEY", "Calibration", "Selection",
    "AggregatesPlan", "plan_aggregates", "split_weights", "quantile_band", "Bounding", "DIAGNOSTICS", "key_totals",
    "auto_histograms", "clamp_candidates", "bucket_of", "add_group_noise", "cells", "selected", "NOISE_KINDS",
    "AggregatesParams", "EventSpec", "Query", "resolve_domain", "table_specs", "DEFAULT_MAX_DOMAIN",
    "MAX_DRIVER_CELLS", "AGGREGATES", "Aggregates", "choose_clamp",
]
