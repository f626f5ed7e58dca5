"""Private regression (docs/regression.md; docs/math.md section 6).

Two methods, one mechanism (``regression``), one parameters class (:class:`RegressionParams`):

* ``method="ssp"`` (the default): sufficient statistics perturbation with AdaSSP's adaptive ridge
  (Wang 2018), for a ``linear`` or ``logistic`` model: ``X^T X``, ``X^T y``, ``y^T y`` and ``n`` of the
  clipped rows in one aggregation pass, Gaussian noise added once on the driver, the ridge from a
  noisy smallest eigenvalue, intervals from a parametric bootstrap (modules ``_ssp``, ``_ssp_fit``;
  docs/math.md section 6.1); the logistic model then refined by ``logistic_steps`` noisy gradient
  passes (module ``_logistic``; docs/math.md section 6.2);
* ``method="sketch"``: the sample-mixing sketch ``S M + W`` of Showkatbakhsh et al. and its additive
  baseline ``M + W`` (below).

The sketch
==========

Data ``M = [A b]`` (n x p, ``p = d + 1``: the features, then the target), every
row clipped to ``||m_i||_2 <= B`` (``row_bound``, declared and public).

Schemes
-------
* ``sketch``: release ``S M + W``. ``S`` is ``m x n`` with i.i.d. ``N(0, 1/m)``
  entries, secret, drawn independently of the data; ``W`` is ``m x p`` Gaussian
  noise. The noise enters ``m`` rows instead of ``n``:
  ``E[(S A + W_A)^T (S A + W_A)] = A^T A + m s^2 I`` (``E S^T S = I_n``).
* ``additive`` (the baseline): release ``M + W`` (n x p), one noisy row per
  input row; ``E[(A + W_A)^T (A + W_A)] = A^T A + n s^2 I``.

Privacy
-------
Neighbours: replace-one only (``n`` is public). Changing row ``i`` from ``m_i``
to ``m_i'`` changes ``S M`` by the rank-one matrix ``S_{:,i} (m_i' - m_i)^T``,
whose Frobenius norm is ``||S_{:,i}||_2 ||m_i' - m_i||_2 <= 2 B ||S_{:,i}||_2``,
with equality at ``m_i' = -m_i``, ``||m_i|| = B``. So the exact L2 sensitivity
for the REALIZED ``S`` is ``Delta_2 = 2 B max_i ||S_{:,i}||_2`` (near ``2 B``
for ``m >= 100``); the additive scheme has ``Delta_2 = 2 B``. ``S`` is drawn
independently of the data, so the Gaussian mechanism calibrated to the realized
``S`` is ``(epsilon, delta)``-DP conditional on every ``S``, hence
unconditionally. Publishing the noise scale reveals ``max_i ||S_{:,i}||``, a
function of ``S`` alone: the conditional guarantee holds even against someone
who knows all of ``S``.

Refused neighbour relations (decided from the parameters, before any data):

* ``add-remove``: the noise is calibrated from the realized columns of ``S``,
  one per record of the public ``n``; an added record would bring a column
  that is not among them (its norm is unbounded), and ``m <= n`` is checked
  against ``n``. The additive scheme has one output row per record, and no
  noise hides the number of rows.
* ``element`` (one attribute changes): the rows are clipped to a norm ball, and
  a norm clip rescales the whole row, so one changed attribute changes every
  coordinate (docs/math.md section 2); section 6 bounds rows, i.e. people.

Calibration: the analytic Gaussian mechanism in Gaussian-DP form. Before any
data is read, :func:`plan_regression` fixes the noise multiplier ``z`` (noise
std / sensitivity) with ``fit_to_epsilon`` so that dp_accounting's epsilon of
the recorded ``GaussianDpEvent(z)`` is at most the request. After the pass the
realized sensitivity is known and :func:`finalize_sketch` draws discrete
Gaussian noise on a power-of-two grid (docs/math.md section 7) whose multiplier,
grid rounding and samplers' slack included, is at least ``z``
(:func:`sparkpriv.privacy.noise.gaussian_noise_from_multiplier`); the receipt
therefore never states less than was spent. The grid holds the public value
bound ``B max_j ||S_{j,:}||_1`` (a function of ``S`` only).

Sketch layout (both engines)
----------------------------
Column ``i`` of ``S`` belongs to the record with GLOBAL row index ``i`` (its
position in the table: partition offset + position in the partition). Columns
are drawn in blocks of :func:`block_rows` ``(m)`` records: block ``k`` is
``stream(seed, SKETCH_STAGE, k).standard_normal((block_rows, m)) / sqrt(m)``,
its row ``j`` is column ``k block_rows + j`` of ``S``. So the columns of a record
depend only on the secret seed, ``m`` and its global index: any partitioning of
the same ordered table gives the same ``S``, a retried task regenerates the same
columns, and no engine ever holds ``S`` whole. (Why the layout is private: the
columns are i.i.d. whatever the keys, and the noise scale is a symmetric
function of them, so ANY assignment of records to distinct indices that does
not depend on ``S`` gives the same output distribution.)

Fits (post-processing of the release)
-------------------------------------
From the released ``R = [A~ b~]`` (``r`` rows: ``m`` for the sketch, ``n`` for
the additive scheme) with per-entry noise variance ``s^2``:
``H = A~^T A~ - debias * r s^2 I + ridge I``, ``x = H^{-1} A~^T b~``. If ``H``
is not positive definite after debiasing, its eigenvalues are raised to a floor
(post-processing; reported as ``eigenvalues_floored``).

Confidence intervals: the rows of the sketch are i.i.d. (rows of ``S`` and of
``W`` are), and ``x`` solves ``sum_j psi_j(x) = 0`` with
``psi_j(x) = a~_j (b~_j - a~_j^T x) + debias s^2 x - ridge x / r``, whose
expectation at the non-private least-squares solution ``x*`` (of the clipped
data, ridge 0) is zero. The sandwich ``H^{-1} (sum_j psi_j psi_j^T) H^{-1}``
estimates the covariance of ``x`` around ``x*`` (times ``r / (r - d)``, the
usual small-sample factor); intervals use Student's t with ``r - d`` degrees
of freedom. For the additive scheme the rows are
independent but not identically distributed; the same sandwich is then
conservative. With ``ridge > 0`` the intervals are around the ridge target,
not ``x*``.

The package's modules, in import order (each imports only those before it; this module re-exports
their names, so ``from sparkpriv.mechanisms import regression`` is the one way in):

- ``_params``: :class:`RegressionParams`, the methods, models and limits, the neighbour relations;
- ``_sketch``: the sketch's layout and per-batch partials, its sensitivity;
- ``_plan``: the plan made before any data (:class:`RegressionPlan`, :func:`plan_regression`),
  clipping and the additive scheme's row noise;
- ``_fit``: the driver's noise and the fits of a release (:class:`RegressionRelease`,
  :func:`fit_from_release`, the sandwich intervals), the in-memory release
  (:func:`release_regression_array`);
- ``_ssp``: AdaSSP's domain, sensitivities, plan and per-block statistics (:func:`plan_ssp`);
- ``_ssp_fit``: the driver's noise on the statistics, the fits and their bootstrap intervals
  (:func:`fit_from_statistics`);
- ``_logistic``: the logistic model's noisy gradient passes, their iteration and intervals, and the
  refit of any SSP release from its model file (:func:`refit_model_file`; docs/math.md section 6.2);
- ``_mechanism``: the mechanism of the release protocol (:class:`Regression`), on any engine.
"""

from __future__ import annotations

from sparkpriv.mechanisms.regression._params import (METHODS, MODELS, SCHEMES, SKETCH_RULES, NEIGHBORS_OK,
                                                     SSP_NEIGHBORS, EPSILON_RANGE, DELTA_RANGE, BOUND_MAX,
                                                     BOUND_MIN, RegressionParams, check_neighbors)
from sparkpriv.mechanisms.regression._sketch import (SKETCH_STAGE, NOISE_STAGE, ADDITIVE_STAGE, _BLOCK_VALUES,
                                                     sketch_rows_for,
                                                     block_rows, _block, sketch_columns, sketch_matrix,
                                                     partial_size, sketch_partial, pack_partial,
                                                     sketch_sensitivity)
from sparkpriv.mechanisms.regression._plan import (RegressionFacts, RegressionPlan, plan_regression,
                                                   clip_regression_rows, additive_noise_rows)
from sparkpriv.mechanisms.regression._fit import (RegressionFit, RegressionRelease, sketch_noise, finalize_sketch,
                                                  _solve, fit_from_moments, sandwich_moments, _intervals,
                                                  gaussian_meat, fit_from_release, fit_from_gram_and_meat,
                                                  _check_arrays, release_regression_array,
                                                  relative_objective_error)
from sparkpriv.mechanisms.regression._ssp import (RHO, COUNTERS, SSPDomain, SSPPlan, feature_radius_sq, ssp_domain,
                                                  eigen_sensitivity, gram_sensitivity, moment_weights,
                                                  moment_sensitivity, plan_ssp, prepare_block, stats_size,
                                                  block_statistics, statistics_fn, signed_edges,
                                                  target_histogram_fn, choose_target_range, occupancy_threshold,
                                                  gradient_sensitivity, hessian_sensitivity, logistic_pass_fn,
                                                  logistic_pass_size)
from sparkpriv.mechanisms.regression._ssp_fit import (LOGISTIC_RADIUS, SSPStatistics, SSPFit, chebyshev_logistic,
                                                      logistic_kappa, exact_steps, finalize_ssp, adassp_ridge, ridge_solve,
                                                      fit_from_statistics)
from sparkpriv.mechanisms.regression._logistic import (LogisticSteps, finalize_logistic_pass, initial_theta,
                                                       bohning_step, newton_step, newton_ridge, logistic_path,
                                                       fit_logistic_steps, fit_from_released, refit_model_file)
from sparkpriv.mechanisms.regression._mechanism import (sketch_slots, indexed_sketch_fn, _RegressionState,
                                                        Regression, _additive_row_map, _gram_fn, _meat_fn,
                                                        _run_additive, _run_ssp, MODEL_FILE, REGRESSION)

__all__ = [
    "METHODS",
    "MODELS",
    "SCHEMES",
    "SKETCH_RULES",
    "RegressionParams",
    "RegressionFacts",
    "RegressionPlan",
    "RegressionFit",
    "RegressionRelease",
    "sketch_rows_for",
    "block_rows",
    "sketch_columns",
    "sketch_matrix",
    "sketch_partial",
    "partial_size",
    "pack_partial",
    "plan_regression",
    "clip_regression_rows",
    "finalize_sketch",
    "additive_noise_rows",
    "fit_from_release",
    "fit_from_moments",
    "sandwich_moments",
    "sketch_sensitivity",
    "release_regression_array",
    "relative_objective_error",
    "SSPDomain",
    "SSPPlan",
    "SSPStatistics",
    "SSPFit",
    "plan_ssp",
    "ssp_domain",
    "feature_radius_sq",
    "eigen_sensitivity",
    "gram_sensitivity",
    "moment_sensitivity",
    "moment_weights",
    "statistics_fn",
    "block_statistics",
    "prepare_block",
    "finalize_ssp",
    "fit_from_statistics",
    "adassp_ridge",
    "logistic_kappa",
    "gradient_sensitivity",
    "hessian_sensitivity",
    "logistic_pass_fn",
    "LogisticSteps",
    "logistic_path",
    "fit_from_released",
    "refit_model_file",
]
