"""DP mixture of generative models (Acs et al., Alg. 1 and 4; docs/math.md section 5).

1. DP k-means (:mod:`~sparkpriv.mechanisms.kmeans`, ``linear`` variant on the
   declared box ``[0, 1]^d`` and row bound) partitions the records: a model
   trains on its last round's cluster (the records nearest to the centres
   that round assigned with, :func:`last_round_centres`), whose noisy mean
   and count are the released centre and size. The assignment is internal
   (never released).
2. One generative model per cluster (:class:`~sparkpriv.mechanisms.rbm.RBM`
   for binary records, :class:`~sparkpriv.mechanisms.vae.VAE` for binary or
   continuous columns), trained with DP-SGD (:mod:`~sparkpriv.mechanisms.dpsgd`)
   at ONE public sampling rate ``q`` and ONE number of steps ``T`` for every
   cluster, normalised by the cluster's noisy size (public). An RBM starts from
   its cluster's released centre projected onto the box points of mass at most
   the cluster's released mean length (:func:`visible_init`; docs/research/dpgm.md,
   "The RBM's starting point"). With ``min_batch``
   a cluster makes ``m_j`` of its ``T`` steps at once (its own rate ``m_j q``,
   ``m_j`` from its noisy size; docs/research/dpgm.md, "Per-cluster sampling rates"):
   each step keeps its own batch and noise, so the event is the same.
3. Released: the k models' parameters, the noisy cluster sizes
   (:func:`cluster_sizes`), the k-means centres and (rbm, by default) each cluster's noisy
   histogram of record lengths (the number of ones of a record, in bins;
   :class:`LengthPlan`), which synthesis draws each record's length from, in a versioned ``.npz`` file
   (:meth:`DPGMModel.save`), with the source's column types (its schema,
   public). :func:`synthesize` samples a cluster by noisy size, then a record
   from that cluster's model (post-processing: no budget);
   :func:`synthesize_table` gives the records as a table in the source's
   column types.
4. With ``marginal_share`` (rbm): the noisy per-item counts (:class:`MarginalPlan`), and
   every cluster's visible biases shifted by one vector so that the mixture's per-item
   marginals move to them (post-processing; docs/research/dpgm.md, "Calibrating the marginals").

Privacy (replace-one; ``n`` public)
-----------------------------------
The release is ``Composed[k-means event, lengths event, item counts event,
SelfComposed(PoissonSampled(q, Gaussian(sigma / 2)), T)]``. The item counts event (when
``marginal_share > 0``) is one Gaussian on the ``d`` column sums of the bounded records,
calibrated alone to ``marginal_share epsilon``: L2 sensitivity ``sqrt(2) R`` (``R`` the row
bound; ``sqrt(2 L)`` for records of at most ``L`` items). The lengths event (when ``length_share > 0``) is one
Gaussian on the k histograms of record lengths, calibrated alone to ``length_share
epsilon``: a replaced record leaves one (cluster, length bin) cell and enters one,
L2 sensitivity ``sqrt(2)``. The k-means part is as in section 4. Training:
if the replaced record ``x`` and its replacement ``x'`` fall in the same
cluster, that cluster's training sees a replace-one change, dominated step by
step by a Poisson-sampled Gaussian of sensitivity ``2C`` (dpsgd module
docstring). If they fall in clusters ``a != b``, cluster ``a`` loses a record and
``b`` gains one; step ``t`` of both clusters together is one mechanism on the
pair of data sets whose output pair is ``P = (1-q) A + q B``, ``Q = (1-q) A +
q B'`` with ``A`` the product of the two clusters' outputs without the record,
``B`` with ``x`` sampled in ``a``, ``B'`` with ``x'`` sampled in ``b``:
``||B - B'|| <= sqrt(2) C``, ``||B - A|| <= C``. The same argument bounds it by
the sensitivity-``2C`` pair. Every cluster runs the same ``(q, sigma, T)``,
so either case is the event above: the "maximum over clusters" of
docs/math.md is attained by every cluster (parallel composition). A cluster
that makes ``m_j`` steps per update (``min_batch``) releases the same ``T``
noisy sums and adds them (post-processing); pairing step ``u`` of cluster ``a``
with step ``u`` of cluster ``b`` covers two clusters with different ``m``
(docs/math.md section 5, "Per-cluster rates as batches of base steps"). The
assignment depends on the data only through the centres the k-means' last
round assigned with (post-processing of its earlier rounds, or data-independent
for one round), and clusters never exchange anything.

The noise multiplier ``sigma`` is calibrated on the composition, so the
accountant's epsilon of the whole release is at most the request.

Quantile clipping (``clip_quantile``; docs/math.md section 5.1): each step also
releases the noisy count of unclipped gradients and the clip follows the
target quantile; the step event becomes ``PoissonSampled(q, Gaussian(z))``,
``z = max(4/sigma^2 + 1/sigma_b^2, 2/sigma^2 + 2/sigma_b^2)^(-1/2)`` (the
second term: the two records in different clusters), calibrated the same way.

The package's modules, in import order (at run time each imports only those before it; this module re-exports
their names, so ``from sparkpriv.mechanisms import dpgm`` is the one way in):

- ``_params``: :class:`DPGMParams` and the defaults;
- ``_lengths``: the histograms of record lengths (:class:`LengthPlan`), drawing lengths, the
  clusters' sizes as trained (:func:`cluster_sizes`);
- ``_marginals``: the per-item counts (:class:`MarginalPlan`) and the shift of the visible biases
  towards them (:func:`marginal_shift`);
- ``_plan``: calibration and the accounted events (:class:`DPGMPlan`, :func:`plan_dpgm`);
- ``_released``: the released model (:class:`DPGMModel`, its file), synthesis and the spread
  of synthetic counts (:func:`query_spread`);
- ``_train``: training in memory (:func:`fit_dpgm_array`, :func:`train_clusters`);
- ``_mechanism``: the mechanism of the release protocol (:class:`DPGM`), on any engine.
"""

from __future__ import annotations

from sparkpriv.mechanisms.column_types import SYNTHETIC_TYPES, synthetic_arrays, synthetic_type
from sparkpriv.mechanisms.dpgm._params import (MODELS, FORMAT_VERSION, READ_VERSIONS, MODEL_FILE, SYNTH_STAGE,
                                               LENGTH_STAGE, CHAIN_STAGE, MARGINAL_STAGE, MARGINAL_SAMPLE_STAGE,
                                               DEFAULT_MARGINAL_SAMPLES, DEFAULT_MARGINAL_SHARE, DEFAULT_LENGTH_STRATA,
                                               STRATA_NOISE_MAX, DEFAULT_LENGTH_SHARE, LENGTH_KEEP_STDS, _POS,
                                               DEFAULT_LEARNING_RATE, DEFAULT_AVERAGE_TAIL, LR_NOISE_REF,
                                               LR_MAX_FACTOR, DPGMParams, length_strata, max_length)
from sparkpriv.mechanisms.dpgm._lengths import (length_edges, LengthPlan, length_plan, WITHIN_BIN, SLOPE_MAX,
                                                bin_slopes, expected_length, synthetic_lengths, draw_lengths,
                                                cluster_sizes, last_round_centres, chain_lengths, cluster_size_std,
                                                reliable_clusters)
from sparkpriv.mechanisms.dpgm._marginals import (MarginalPlan, marginal_plan, column_sums, sample_records,
                                                  synthetic_sums, mixture_marginals, model_error, error_bands,
                                                  banded_model_error, marginal_shift,
                                                  shift_visible_biases, cluster_samples, calibration, model_sums)
from sparkpriv.mechanisms.dpgm._plan import (_make_model, DPGMPlan, accounting_note, _Relations, _bounds,
                                             calibrate_dpgm, requested_event, plan_for_rows, plan_dpgm)
from sparkpriv.mechanisms.dpgm._released import (DPGMModel, synthesize, synthesize_table, synthesize_part,
                                                 DEFAULT_SPREAD_REPEATS, SPREAD_METHOD, QuerySpread,
                                                 answer_dense, _spread_seed, query_spread, uncertainty_public)
from sparkpriv.mechanisms.dpgm._train import (INIT_FLOOR, project_capped, visible_masses, visible_init,
                                              fit_dpgm_array, _model, training_order, model_public,
                                              final_clips_public, assign_clusters, train_clusters, marginal_sums,
                                              calibrate_marginals, canonical_order)
from sparkpriv.mechanisms.dpgm._mechanism import (dense_rows, assign_sparse, _records_stats_fn, _group_fn,
                                                  _lengths_fn, _train_fn, TRAINING_CHUNKS, _training_progress,
                                                  DPGM, DPGM_MECHANISM)

__all__ = ["MODELS", "FORMAT_VERSION", "MODEL_FILE", "DPGMParams", "DPGMPlan", "DPGMModel", "calibrate_dpgm",
           "cluster_sizes", "cluster_size_std", "reliable_clusters", "requested_event", "plan_for_rows", "plan_dpgm", "fit_dpgm_array", "assign_clusters",
           "train_clusters", "canonical_order", "assign_sparse", "synthesize", "synthesize_part", "synthesize_table",
           "synthetic_type", "synthetic_arrays", "SYNTHETIC_TYPES", "query_spread", "QuerySpread", "answer_dense",
           "DPGM", "DPGM_MECHANISM"]
