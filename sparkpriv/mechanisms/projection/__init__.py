"""JL random projection + noise (Dhaliwal et al.; docs/math.md section 2).

Release ``Z = clip(X) P + N`` with ``P`` in R^{d x k}, ``P_ij ~ N(0, 1/k)``,
drawn from a secret seed (OS entropy) independently of the data, and ``N``
i.i.d. noise per entry.

Privacy
-------
Neighbour relation: replace-one (default; ``n`` is public) or the paper's
element-wise relation (one attribute changes by at most its bound), which
protects ONE ATTRIBUTE, not a person, and is labelled so everywhere.
Add-remove is refused: the output has one row per input row, so adding or
removing a person changes the row count, which no noise hides. The
element-wise relation needs a per-column box and/or ``element_bound`` and
refuses ``row_bound``: a norm clip rescales the whole row, so one changed
attribute would change every coordinate.

Sensitivity: computed exactly from the *realized* ``P`` and the declared bounds
(:mod:`sparkpriv.privacy.sensitivity`); enforced by clipping every row to the
declared box and/or norm ball before projecting
(:func:`sparkpriv.privacy.bounds.clip_rows`). Since ``P`` is independent of the
data, the guarantee holds conditional on every ``P`` and hence unconditionally.

Guarantee: Laplace noise gives pure ``epsilon``-DP for the L1 sensitivity;
Gaussian noise gives ``(epsilon, delta)``-DP (analytic Gaussian mechanism) for
the L2 sensitivity. Both are added on a power-of-two grid by
:mod:`sparkpriv.privacy.noise`, and the single event is a dp_accounting event.

Range: every projected value is clamped to ``[-M, M]``, with ``M`` public: the
bound that the declared box or row bound implies for the realized ``P``
(:func:`projected_value_bound`), or, with ``element_bound`` alone (no declared
range), ``2^28`` noise standard deviations; each attribute is then first
clamped so that no projected value exceeds ``M``. Clamping each coordinate
never increases the distance between neighbouring outputs, so the sensitivity
is unchanged, and the noise grid is chosen to hold ``M``: a release never
fails because of a data value.

Public: ``d``, ``k``, the bounds, the noise kind and scale (needed for distance
recovery), ``n`` (replace-one), ``M``. Secret: ``P`` and the noise seed.

The mechanism: :class:`Projection` (registered as ``projection``) with its
:class:`ProjectionParams`, on the protocol (docs/architecture.md): dense rows of
a table, or bounded event records (sparse; the sum of the rows of ``P`` at a
person's items, docs/math.md section 8), on the local or the Spark engine;
the public function is :func:`sparkpriv.api.release_projection`.

Distance recovery (corrected Algorithm 2): with ``s2`` the per-entry noise
variance, ``D = ||Z_i - Z_j||^2 - 2 k s2`` is unbiased for ``||x_i - x_j||^2``
(over ``P`` and the noise), and with ``x = x_i - x_j``

    Var D = (2/k) ||x||^4 + k c s2^2 + 8 s2 ||x||^2,

where ``c = Var(e^2) / s2^2`` for ``e`` the difference of two noise draws:
``c = 14`` for Laplace noise (``E e^4 = 18 s2^2``) and ``c = 8`` for Gaussian
noise (``E e^4 = 12 s2^2``). The paper's Claim 7 is wrong.

Uncertainty (docs/math.md section 2, "Intervals for squared distances"): the
randomness is the draw of the secret ``P`` and the noise, for a fixed pair of
(clipped) rows. :func:`sq_distance_intervals` gives the estimate, its std and
a confidence interval; the interval inverts a scaled chi-square with the
mean and variance above (exact for Gaussian noise, where
``||Z_i - Z_j||^2 = (||x||^2 / k + 2 s2) chi2_k``), not ``D +- 1.96 std``,
which covers far less than claimed at small ``k`` (61% at ``k = 1``, 90% at
``k = 20``). ``Release.squared_distances`` is the accessor; the receipt
states the per-entry noise std (``uncertainty``).

The package's modules, in import order (each imports only those before it; this module re-exports
their names, so ``from sparkpriv.mechanisms import projection`` is the one way in):

- ``_core``: the matrix, the plan made before any data (:class:`ProjectionPlan`,
  :func:`plan_projection`), the projected rows, and the squared distances recovered from a
  release with their intervals (:func:`sq_distance_intervals`);
- ``_mechanism``: :class:`ProjectionParams` and the mechanism of the release protocol
  (:class:`Projection`), on any engine.
"""

from __future__ import annotations

from sparkpriv.mechanisms.projection._core import (NOISE_KINDS, NOISE_STAGE, DEFAULT_RANGE_STDS,
                                                   draw_projection_matrix, ProjectionPlan, plan_projection,
                                                   projected_value_bound, project_rows, clamp_projected,
                                                   secret_matrix_and_seed, recover_sq_distances, distance_variance,
                                                   SqDistances, _chi2_match, sq_distance_intervals)
from sparkpriv.mechanisms.projection._mechanism import (_POS, ROW_COUNTERS, _RECORDS_REFUSED, ProjectionParams,
                                                        _State, _Secrets, _Counts, _records_cap, Projection,
                                                        _dp_row_bound, _norm_histogram_fn, _wide_grid,
                                                        _dense_row_map, _sparse_row_map, PROJECTION)

__all__ = [
    "ProjectionPlan",
    "ProjectionParams",
    "Projection",
    "draw_projection_matrix",
    "plan_projection",
    "project_rows",
    "clamp_projected",
    "projected_value_bound",
    "recover_sq_distances",
    "distance_variance",
    "sq_distance_intervals",
    "SqDistances",
    "NOISE_KINDS",
]
