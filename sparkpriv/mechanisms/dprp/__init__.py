"""DPRP: private table release by noisy random projection + noisy covariance
(Gondara & Wang, UAI 2020; docs/math.md section 3, corrected).

Algorithm (on rows prepared as below, ``d`` columns after preparation)::

    R    ~ N(0, 1/k1)^{d x k1}                      secret, OS entropy
    P'   = X R + M1,   M1 i.i.d. Gaussian per entry  (projection step)
    C'   = X^T X + M2, M2 symmetric: upper triangle i.i.d., mirrored  (Gram step)
    V'   = top-k2 eigenvectors of C' (eigh)
    M    = (V'^T R)^+ V'^T                          (k1 x d), driver only
    X'   = P' M                                     (n x d)

Preparation of a row (one function, :func:`prepare_rows`, used by the numpy
path and by every Spark batch): nulls are filled (public constant or DP column
mean), each feature is mapped to ``[0, 1]`` by its declared public bounds
``(x - lower) / (upper - lower)`` and clipped to the box, a private label is
appended as a one-hot block with value ``label_scale``, and the row is clipped
to the L2 ball of radius ``Z = row_bound`` (default ``sqrt(d_features +
label_scale^2)``, the largest norm the box allows, so the norm clip never
changes a row). The output is decoded by :func:`decode_rows`: features clipped
to ``[0, 1]``, mapped back to ``[lower, upper]``, integer columns rounded; a
private label is the argmax of its reconstructed block. All of this is
post-processing of the two noisy quantities.

Privacy
-------
Neighbour relation: replace-one (one record replaced; ``n`` public), the
library default. Labels declared public (``labels="public"``) are public data:
a neighbour changes one record's features and keeps its label.

Sensitivities (exact suprema over the prepared-row domain; proofs in
docs/dprp.md, section "Sensitivity"). A prepared row ``x`` is non-negative,
its features are at most 1, its label block (private labels) has one entry
of value at most ``s = label_scale`` and ``||x||_2 <= Z``:

* Projection: one record changes one row of ``X R`` by ``(x - y) R``, so
  ``Delta_2(X R) = D s_max(R)`` for the realized ``R``, with
  ``D^2 = sup ||x - y||^2 = max_k min(k + s^2, Z^2) + min(d - k + s^2, Z^2)``
  (:func:`difference_bound_sq`; ``s = 0`` without a label block): ``d`` at
  the default ``Z`` (``d + 2 s^2`` with private labels; ``min(2 L, d)`` for
  event records). Exact for ``D`` (attained by two rows on disjoint
  supports); deterministic given ``R`` (the paper's Lemma 2 holds only with
  probability ``1 - delta`` for one fixed pair). ``R`` is independent of the
  data, so the guarantee holds conditional on every ``R``, hence
  unconditionally.
* Gram: the code noises the ``d (d + 1) / 2`` unique entries of ``X^T X``
  (upper triangle with the diagonal, each once, mirrored), which move by
  ``triu(x x^T - y y^T)``. Its supremum is attained at vertices of the box
  (features in {0, 1}): ``d (d + 1) / 2`` without labels, ``d (d + 1) / 2 +
  d + 2`` with private labels of scale 1 (:func:`gram_bound_sq`). With a
  norm clip below the box's largest norm the calibration is the smaller of
  that and ``2 max ||triu(x x^T)||^2``, exact when two largest rows fit on
  disjoint supports (event records with ``d >= 2 L``: ``L (L + 1)``).
  The general bounds ``2 Z`` and ``sqrt(2) Z^2`` (any real rows) over-noise
  by about 2x on the box and are not used.

Calibration (docs/math.md section 1): both steps are Gaussian mechanisms, split
exactly in Gaussian DP. ``mu = gdp_mu_for(epsilon, delta)`` is the largest
``mu`` whose (epsilon, delta) curve meets the target; shares ``w`` (default
80 % projection / 20 % Gram, ``budget_split``) give ``mu_i = sqrt(w_i) mu``
(rounded down), ``sum mu_i^2 <= mu^2``, and each step's noise multiplier is
``1 / mu_i`` (``sigma_i = Delta_i / mu_i``). The events are
``GaussianDpEvent(1 / mu_i)``; dp_accounting's PLD gives the composed
epsilon at ``delta``, which can exceed the analytic value slightly, so
``mu`` is lowered until it is at most the target (``fit_to_epsilon``; tested). The noise objects of
:mod:`sparkpriv.privacy.noise` (discrete Gaussian on a power-of-two grid) have
multipliers at least ``1 / mu_i`` (checked at run time), so the recorded
nominal events are conservative. With ``fill="dp-mean"`` a third Gaussian
step (per-column noisy sums and counts of non-missing values, L2 sensitivity
``sqrt(2 d)`` under replace-one: each of the ``d`` sums moves by at most 1 on
the ``[0, 1]`` scale and each count by at most 1) gets ``impute_share`` of
``mu^2`` first. Public labels: each class is released by its own run on the
rows of that class (each record is in exactly one class): parallel
composition, the overall event is the event of one run, and the class sizes
are released (said in the receipt).

Grids: a Gram entry can be as large as ``n Z^2``, far above the about 90
sigma that the noise module's default grid holds. The Gram (and imputation)
noise passes the public bound ``n Z^2`` (``n`` is public under replace-one) as
``max_abs`` to :func:`~sparkpriv.privacy.noise.gaussian_noise_from_multiplier`,
which coarsens the power-of-two grid (sigma stays at least ``2^30`` grid
steps, i.e. ``n Z^2 <= 2^32 sigma_gram``: ``n`` up to about ``3e9 / mu_gram``
at the default ``Z``, where ``sigma_gram >= Z^2 / (sqrt(2) mu_gram)``; a larger
``n`` is refused with a ParameterError). The row noise passes
``Z s_max(R)``, the largest ``|x R|_j``.

Public: ``d``, ``k1``, ``k2``, the bounds, ``Z``, the noise scales and
sensitivities (``D s_max(R)`` reveals ``s_max(R)``, as the projection
release reveals its sensitivity), the class values and, with public labels,
the class sizes. Secret: ``R`` and the noise seeds (never written, logged or
raised).

k1 and k2 (data-independent defaults)
-------------------------------------
``k2 = round(0.6 d)`` as in the paper. The noise of a released row is
``e M`` with ``e ~ N(0, sigma_1^2 I_k1)``: its energy is
``sigma_1^2 ||(V'^T R)^+||_F^2``, and ``sigma_1`` is proportional to
``s_max(R) ~ 1 + sqrt(d / k1)`` while the reconstruction amplifies by up to
``1 / s_min(V'^T R)``, about ``1 - sqrt(k2 / k1)`` (0.06 at ``k1 = k2``, 0.43
at ``2 k2``, 0.60 at ``4 k2``; docs/math.md). Both improve as ``k1`` grows, with a
cost (flops and noise draws per row) linear in ``k1``. ``k1 = 4 k2``
(``= 2.4 d``) keeps the amplification below about 2 and ``s_max(R)`` near
1.65 at a cost of ``4 k2`` noise draws per row. A warning is logged when
``k1 < 4 k2`` or the realized ``s_min(V'^T R)`` is below
``1 / AMPLIFICATION_WARN`` (the value itself is not logged: it depends on
``R``).

Event records (sparse person records): :mod:`sparkpriv.mechanisms.dprp_records`.

The mechanism (docs/architecture.md): :class:`DPRPParams` and :class:`DPRP`
(``dprp``), for tables and bounded event records, on either engine.
:meth:`DPRP.plan` validates, draws ``R`` and the noise seed (the secrets) and
calibrates every step, so every event (the DP-means pass with
``fill="dp-mean"`` too) is known before the budget is reserved.
:meth:`DPRP.run`: the DP-means pass (optional) and the Gram pass through
``engine.aggregate`` (only the sums reach the driver), the noise added once
and the solve on the driver, then the rows pass through ``engine.map_rows``:
row noise from ``stream(seed, ROW_NOISE_STAGE, partition id)``, drawn block
after block, so a retried task reproduces it. The release function is
:func:`sparkpriv.api.release_dprp`.

Reconstruction is exact without noise on data of rank ``r <= k2``: the rows
lie in the span of ``V'`` (top-``k2`` eigenvectors of ``X^T X``), so
``X R = (X V')(V'^T R)`` and ``V'^T R`` (``k2 x k1``, ``k1 >= k2``) has full row
rank almost surely, so ``X R (V'^T R)^+ V'^T = X V' V'^T = X`` (tested).

The package's modules, in import order (each imports only those before it; this module re-exports
their names, so ``from sparkpriv.mechanisms import dprp`` is the one way in): ``_plan`` (defaults,
sensitivities, the budget split and :class:`DPRPPlan`), ``_rows`` (the per-batch work and the
driver's solve), ``_mechanism`` (:class:`DPRPParams` and the protocol mechanism :class:`DPRP`).
"""

from __future__ import annotations

from sparkpriv.mechanisms.dprp._plan import (LABEL_MODES, DEFAULT_BUDGET_SPLIT, DEFAULT_IMPUTE_SHARE,
                                             AMPLIFICATION_WARN, ROW_NOISE_STAGE, GRAM_NOISE_STAGE,
                                             IMPUTE_NOISE_STAGE, _SAFETY, default_k2, default_k1,
                                             difference_bound_sq, gram_bound_sq, projection_sensitivity,
                                             gram_sensitivity, split_budget, DPRPPlan, _jsonable,
                                             validate_params, plan_dprp, draw_secrets, _check_split)
from sparkpriv.mechanisms.dprp._rows import (fill_missing, prepare_rows, gram_partial, gram_from_partial,
                                             impute_partial, dp_column_means, fill_value_std,
                                             released_value_std, uncertainty_public, noisy_grams,
                                             reconstruction_matrix, solve, reconstruct_rows, decode_rows,
                                             check_noise_multiplier)
from sparkpriv.mechanisms.dprp._mechanism import (DEFAULT_THRESHOLD, _POS, _EMPTY, DPRPParams, DPRP,
                                                  _impute_fn, _gram_fn, _rows_fn, _records_gram_fn,
                                                  _records_rows_fn, DPRP_MECHANISM)

__all__ = [
    "check_noise_multiplier",
    "DPRP",
    "DPRPParams",
    "DPRPPlan",
    "LABEL_MODES",
    "DEFAULT_BUDGET_SPLIT",
    "default_k1",
    "default_k2",
    "projection_sensitivity",
    "gram_sensitivity",
    "difference_bound_sq",
    "gram_bound_sq",
    "split_budget",
    "plan_dprp",
    "draw_secrets",
    "prepare_rows",
    "gram_partial",
    "gram_from_partial",
    "impute_partial",
    "dp_column_means",
    "fill_value_std",
    "released_value_std",
    "noisy_grams",
    "reconstruction_matrix",
    "reconstruct_rows",
    "decode_rows",
]
