"""DP synthetic person x item tables from released lengths and item counts (docs/math.md section 10).

The release (:class:`Synthetic`, mechanism ``"synthetic"``) measures, once each, the histogram
of the number of distinct items per person and the per-item counts of the records bounded at
``L`` items; the model (:class:`SyntheticModel`) draws each synthetic person's number of items
from the first and the items from the second. See docs/utility.md for how it compares with the
other releases on real tables.
"""

from sparkpriv.mechanisms.synthetic._model import FORMAT_VERSION, MODEL_FILE, SYNTH_STAGE, SyntheticModel
from sparkpriv.mechanisms.synthetic._post import (CALIBRATE_LOSS, CALIBRATE_STDS, TAIL_STDS, calibrate, expand_bins,
                                                  pooled_lengths, shifted_draws, shrunk_counts)
from sparkpriv.mechanisms.synthetic._mechanism import (MAX_COUNT, SYNTHETIC, Synthetic, SyntheticParams,
                                                       SyntheticPlan, item_sums_fn, plan_synthetic)

__all__ = ["SyntheticModel", "MODEL_FILE", "FORMAT_VERSION", "SYNTH_STAGE", "pooled_lengths", "shrunk_counts", "expand_bins",
           "TAIL_STDS", "Synthetic", "SyntheticParams", "SyntheticPlan", "SYNTHETIC", "item_sums_fn",
           "plan_synthetic", "MAX_COUNT", "calibrate", "shifted_draws", "CALIBRATE_STDS", "CALIBRATE_LOSS"]
