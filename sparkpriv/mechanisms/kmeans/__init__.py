"""DP k-means with noisy per-cluster sums (Acs et al., Alg. 2; docs/math.md section 4).

Two variants share one Lloyd loop:

* ``linear`` (DPLloyd / SuLQ, the baseline diffprivlib also implements): the
  features are the clipped input rows, ``||x||_2 <= C``;
* ``kernel``: random Fourier features of the RBF kernel
  ``exp(-||x - y||^2 / (2 s^2))``: ``W`` (D, d) with ``W_ij ~ N(0, 1/s^2)`` and
  the *paired* features ``z(x) = [cos(W x), sin(W x)] / sqrt(D)``, so that
  ``||z(x)||_2^2 = (1/D) sum_i (cos^2 + sin^2) = 1`` exactly: ``C = 1`` is a
  deterministic bound (the paper's single-cosine features are not bounded by 1;
  docs/math.md). We use ``C = 1 + 1e-12`` to cover float rounding in cos/sin.

Each iteration (:func:`cluster_stats` per batch, :func:`noisy_update` on the
driver): assign rows to the nearest current centre; per cluster the count
``n_j`` and the sum ``S_j`` of features, as ONE float64 vector of length
``k (D' + 1)`` laid out as a ``(k, D' + 1)`` matrix ``[n_j, S_j]``; partial
vectors of batches and partitions are summed; the driver adds Gaussian noise
ONCE and sets ``centre_j = noisy S_j / max(noisy n_j, 1)``.

Privacy
-------
Neighbours: replace-one (``n`` is public). Public: ``k``, ``d``, the bounds,
``T``, the kernel width, ``W`` (drawn independently of the data and released),
the initial centres (data-independent), ``n``. Secret: the noise seed.

Sensitivity of one iteration (record ``x`` replaced by ``x'``, features of
norm at most ``C``): if they fall in different clusters, the counts change by
``sqrt(2)`` (two entries by 1) and the sums by ``sqrt(||z||^2 + ||z'||^2) <=
sqrt(2) C``; in the same cluster the counts do not change and the sums change
by ``||z - z'|| <= 2 C``. With noise ``s_n`` on counts and ``s_S`` on sums the
iteration is a Gaussian mechanism on ``(n / s_n, S / s_S)`` with unit noise,
i.e. mu-GDP with

    mu^2 = max(2 / s_n^2 + 2 C^2 / s_S^2, 4 C^2 / s_S^2)
        <= 2 / s_n^2 + 4 C^2 / s_S^2            (docs/math.md's bound).

**Noise split between counts and sums.** We take ``s_n = s_S / C``: then both
cases give ``mu^2 = 4 C^2 / s_S^2`` -- the counts cost nothing beyond what the
same-cluster case of the sums already costs. Concretely the driver noises the
single vector ``v = (C n_j, S_j)_j`` with i.i.d. ``N(0, s_S^2)`` per entry;
its L2 sensitivity is ``2 C`` in both cases (``sqrt(2 C^2 + 2 C^2)`` and
``2 C``), so one call of :func:`sparkpriv.privacy.noise.add_noise` with
sensitivity ``2 C`` and noise multiplier ``1 / mu_iter`` releases the whole
iteration; noisy counts are ``v_n / C`` (std ``s_S / C``).

**Budget split.** ``mu_total = gdp_mu_for(epsilon, delta)`` (analytic
Gaussian, exact). Gaussian-DP composes exactly, also adaptively:
``mu_total^2 = T mu_iter^2 + mu_final^2``. ``kernel``: the last step releases
input-space centres as noisy per-cluster means of the clipped inputs
(sensitivity ``2 C_x``, ``C_x`` the input norm bound), with share
``final_share`` (default 0.1) of ``mu_total^2``; the T iterations share the
rest equally. ``linear``: the features ARE the clipped inputs, so the centres
of iteration T are the input-space release; no extra step (all of
``mu_total^2`` goes to the iterations). Splits round down
(:func:`~sparkpriv.privacy.calibration.split_mu`). Each noise addition is a
discrete Gaussian on a power-of-two grid and is recorded as a
``GaussianDpEvent`` whose multiplier is at least ``1 / mu`` (the grid rounding
is in its sensitivity, and the noise samplers' slack, docs/noise.md, in its
``mu``); the release's event is ``Composed[SelfComposed(iteration, T), final]``.
``mu_total`` is then lowered, if need be, until dp_accounting's epsilon of that
event is at most the requested epsilon (``fit_to_epsilon``: its PLD can state a
little more than the analytic value, e.g. 1.000000015 for epsilon 1).

**Grid.** :func:`~sparkpriv.privacy.noise.gaussian_noise_from_multiplier`
picks a grid about ``2^-56`` of sigma, which only admits values up to about
``64 sigma``; counts and sums reach ``n C``. The grid here is chosen from the
public cap ``MAX_ROWS C`` instead (data-independent, so the event is known
before any data is read), and ``n <= MAX_ROWS`` is checked.

Initial centres are data-independent: ``k`` uniform points of the declared
domain (box, else L2 ball), clipped and mapped through the feature map, or a
public sample given by the user. Assignments are never released.

**Post-processing** (free under DP: a function of the noisy outputs and public
bounds only; docs/kmeans.md, "Post-processing"). A cluster with (almost) no
rows has a centre ``noise / max(noisy n, 1)``: pure noise, far outside the
domain (norms of 10^3 to 3 x 10^4 were seen for MNIST rows in ``[0, 1]^784``).
So, after every noise addition:

* each centre is projected onto the declared domain: input-space centres (and
  the ``linear`` iteration centres) through the same clip as the rows (box
  clip, then scaling onto the row-bound ball), since a mean of clipped rows
  lies in their convex hull; ``kernel`` feature centres are scaled onto the
  unit ball (a mean of unit vectors). The next iteration uses the projected
  centres;
* released sizes are clamped at 0;
* a cluster is **unreliable** when a noisy size its released centres depend
  on is below ``reliability_stds`` (default 3) standard deviations of that
  size's noise: for ``linear`` the last iteration's size, for ``kernel`` the
  last iteration's (the feature centre ``predict`` uses) or the final step's
  (the input-space centre). The model and the receipt list them, and
  :meth:`~sparkpriv.mechanisms.kmeans_model.KMeansModel.predict` does not
  assign points to them unless asked.

The package's modules, in import order (each imports only those before it; this module re-exports
their names, so ``from sparkpriv.mechanisms import kmeans`` is the one way in):

- ``_features``: the variants' feature maps (:class:`FeatureMap`, random Fourier features);
- ``_plan``: the noise of the per-cluster statistics and the plan made before any data
  (:class:`KMeansPlan`, :func:`plan_kmeans`);
- ``_lloyd``: one Lloyd iteration's per-batch statistics and the driver's noisy update,
  post-processing, initial centres and the in-memory fit (:func:`fit_from_stats`);
- ``_mechanism``: :class:`KMeansParams` and the mechanism of the release protocol
  (:class:`KMeans`), on any engine.
"""

from __future__ import annotations

from sparkpriv.mechanisms.kmeans._features import (VARIANTS, MAX_ROWS, ITER_STAGE, FINAL_STAGE, C_ROUNDING,
                                                   DEFAULT_RELIABILITY_STDS, _POS, draw_frequencies, rff_features,
                                                   _rff_of_projection, input_norm_bound, FeatureMap,
                                                   _kernel_width_required, make_feature_map, project_to_ball)
from sparkpriv.mechanisms.kmeans._plan import (max_clusters, calibrate_stats_noise, KMeansPlan, plan_kmeans)
from sparkpriv.mechanisms.kmeans._lloyd import (assign_nearest, cluster_stats, cluster_input_sums_sparse,
                                                noisy_update, reliability_flags, initial_centres, check_k_for_n,
                                                check_reliability_stds, fit_from_stats, _tuple,
                                                clustering_accuracy)
from sparkpriv.mechanisms.kmeans._mechanism import (KMeansParams, _KMeansState, _per_column, KMeans, _features_fn,
                                                    _stats_fn, _input_stats_fn, KMEANS)

__all__ = [
    "VARIANTS",
    "MAX_ROWS",
    "FeatureMap",
    "KMeansPlan",
    "KMeansParams",
    "KMeans",
    "draw_frequencies",
    "rff_features",
    "input_norm_bound",
    "max_clusters",
    "make_feature_map",
    "plan_kmeans",
    "calibrate_stats_noise",
    "assign_nearest",
    "cluster_stats",
    "noisy_update",
    "project_to_ball",
    "reliability_flags",
    "DEFAULT_RELIABILITY_STDS",
    "initial_centres",
    "clustering_accuracy",
]
