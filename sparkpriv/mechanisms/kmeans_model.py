"""The released k-means model: only public things (no data, no secrets).

It holds the noisy centres in input space, the noisy counts, the declared
bounds, and for the ``kernel`` variant the public frequency matrix ``W``, the
kernel width and the noisy feature-space centres, so that new points can be
assigned without touching the private table again. ``predict`` is numpy;
``assign`` runs the same function over a Spark DataFrame.

It also records the post-processing of the release (docs/kmeans.md,
"Post-processing"): centres projected onto the declared domain, sizes clamped
at 0, and the indices of the *unreliable* clusters, whose noisy size was
below ``reliability_stds`` standard deviations of the size noise (their
centres may be pure noise). ``predict`` and ``assign`` leave those out unless
``include_unreliable=True``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import ParameterError

__all__ = ["KMeansModel", "MODEL_FORMAT", "MODEL_FILE", "POSTPROCESSING"]

MODEL_FORMAT = "sparkpriv.kmeans-model/2"
_OLD_FORMATS = ("sparkpriv.kmeans-model/1",)  # no reliability fields: every cluster is used
MODEL_FILE = "_kmeans_model.json"
POSTPROCESSING = {
    "centers": "projected onto the declared domain (box clip, then scaling onto the row-bound "
               "ball); kernel feature centres scaled onto the unit ball",
    "counts": "clamped at 0",
    "unreliable": "clusters whose noisy size is below reliability_stds standard deviations of "
                  "the size noise (kernel: the last iteration's or the final step's size); "
                  "predict/assign leave them out unless include_unreliable=True",
}


@dataclass
class KMeansModel:
    """A released DP k-means clustering.

    Attributes
    ----------
    variant : {"linear", "kernel"}
    centers : ndarray of shape (k, n_features)
        Noisy centres in input space, projected onto the declared domain.
    counts : ndarray of shape (k,)
        Noisy cluster sizes of the step that produced ``centers``, clamped at 0.
    bounds : dict
        The declared bounds (public) used to clip inputs before assignment.
    W : ndarray of shape (frequencies, n_features) or None
        Public random Fourier frequencies (``kernel``).
    kernel_width : float or None
    feature_centers : ndarray of shape (k, 2 frequencies) or None
        Noisy centres in feature space (``kernel``); assignment uses these.
    feature_counts : ndarray of shape (k,) or None
        ``kernel``: the last iteration's noisy sizes (clamped at 0), which
        ``feature_centers`` depend on.
    unreliable : tuple of int or None
        Indices of the unreliable clusters (None: unknown, a model file of
        format 1, written before the flag existed).
    reliability_stds : float or None
        The threshold, in standard deviations of the size noise.
    count_std, sum_std : float or None
        Standard deviation of the noise on each size in ``counts`` and on each
        coordinate of the noisy per-cluster sums behind ``centers``.
    feature_count_std, feature_sum_std : float or None
        The same for the last iteration (``kernel``).
    """

    variant: str
    centers: np.ndarray
    counts: np.ndarray
    bounds: dict
    W: np.ndarray | None = None
    kernel_width: float | None = None
    feature_centers: np.ndarray | None = None
    feature_counts: np.ndarray | None = None
    unreliable: tuple | None = None
    reliability_stds: float | None = None
    count_std: float | None = None
    sum_std: float | None = None
    feature_count_std: float | None = None
    feature_sum_std: float | None = None

    @property
    def k(self) -> int:
        return int(np.asarray(self.centers).shape[0])

    @property
    def reliable(self) -> np.ndarray:
        """Boolean mask of shape (k,): ``False`` for the unreliable clusters."""
        mask = np.ones(self.k, dtype=bool)
        if self.unreliable:
            mask[list(self.unreliable)] = False
        return mask

    def uncertainty(self) -> dict:
        """Noise scale of the released numbers (public: from the calibration).

        ``count_std``: std of the noise on each size. ``center_std`` (k,
        n_features): first-order (delta-method) std of each centre coordinate,
        ``sqrt(sum_std^2 + center^2 count_std^2) / max(count, 1)``; it is only
        meaningful for reliable clusters (size well above ``count_std``) and
        ignores the projection onto the domain.
        """
        if self.count_std is None or self.sum_std is None:
            raise ParameterError("This model file (format 1) does not record its noise scale.")
        c = np.asarray(self.centers, float)
        n = np.maximum(np.asarray(self.counts, float), 1.0)[:, None]
        std = np.sqrt(self.sum_std ** 2 + c * c * self.count_std ** 2) / n
        return {"count_std": float(self.count_std), "center_std": std}

    def feature_map(self):
        from sparkpriv.mechanisms.kmeans import FeatureMap
        from sparkpriv.privacy.bounds import Bounds

        b = self.bounds
        bounds = Bounds(len(self.centers[0]), None if b["lower"] is None else tuple(b["lower"]),
                        None if b["upper"] is None else tuple(b["upper"]), b["row_bound"], b["norm"])
        return FeatureMap(self.variant, bounds, None if self.W is None else np.asarray(self.W),
                          self.kernel_width)

    def assignment_centers(self) -> np.ndarray:
        return np.asarray(self.feature_centers if self.variant == "kernel" else self.centers, float)

    def assignment_clusters(self, include_unreliable: bool = False) -> np.ndarray:
        """Indices of the clusters ``predict``/``assign`` may return.

        Raises ParameterError when every cluster is unreliable and
        ``include_unreliable`` is False.
        """
        if not isinstance(include_unreliable, bool):
            raise ParameterError(f"The 'include_unreliable' parameter must be True or False. "
                                 f"Got {include_unreliable!r} instead.")
        if include_unreliable:
            return np.arange(self.k)
        idx = np.flatnonzero(self.reliable)
        if idx.size == 0:
            raise ParameterError(
                f"Every one of the {self.k} clusters of this model is unreliable: each noisy size is "
                f"below {self.reliability_stds:g} standard deviations of the size noise, so the "
                "centres are (mostly) noise. Release again with a larger epsilon or a smaller k, or "
                "pass include_unreliable=True to assign points to these centres anyway."
            )
        return idx

    def predict(self, X, *, include_unreliable: bool = False) -> np.ndarray:
        """Cluster index of each row of ``X`` (n_samples, n_features): clip, map, nearest centre.

        Only reliable clusters are candidates unless ``include_unreliable``;
        the indices returned are those of the model (0 .. k-1).
        """
        from sparkpriv.mechanisms.kmeans import assign_nearest

        idx = self.assignment_clusters(include_unreliable)
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.centers.shape[1]:
            raise ParameterError(
                f"X must have shape (n_samples, {self.centers.shape[1]}). Got {X.shape} instead."
            )
        Z, _, _ = self.feature_map().features(X)
        return idx[assign_nearest(Z, self.assignment_centers()[idx])]

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict:
        def arr(a):
            return None if a is None else np.asarray(a, float).tolist()

        return {
            "format": MODEL_FORMAT,
            "variant": self.variant,
            "k": self.k,
            "centers": arr(self.centers),
            "counts": arr(self.counts),
            "bounds": self.bounds,
            "kernel_width": self.kernel_width,
            "W": arr(self.W),
            "feature_centers": arr(self.feature_centers),
            "feature_counts": arr(self.feature_counts),
            "unreliable_clusters": None if self.unreliable is None else [int(j) for j in self.unreliable],
            "reliability_stds": self.reliability_stds,
            "noise_std": {"count": self.count_std, "sum": self.sum_std,
                          "feature_count": self.feature_count_std, "feature_sum": self.feature_sum_std},
            "postprocessing": POSTPROCESSING,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "KMeansModel":
        fmt = d.get("format")
        if fmt != MODEL_FORMAT and fmt not in _OLD_FORMATS:
            raise ParameterError(f"Not a sparkpriv k-means model (format {fmt!r}).")

        def arr(a):
            return None if a is None else np.asarray(a, dtype=np.float64)

        m = cls(d["variant"], arr(d["centers"]), arr(d["counts"]), d["bounds"], arr(d["W"]),
                d["kernel_width"], arr(d["feature_centers"]))
        if fmt == MODEL_FORMAT:
            s = d["noise_std"]
            u = d["unreliable_clusters"]
            m.feature_counts = arr(d["feature_counts"])
            m.unreliable = None if u is None else tuple(int(j) for j in u)
            m.reliability_stds = d["reliability_stds"]
            m.count_std, m.sum_std = s["count"], s["sum"]
            m.feature_count_std, m.feature_sum_std = s["feature_count"], s["feature_sum"]
        return m

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def save(self, path: str) -> None:
        """Write the model as JSON to the local file ``path``."""
        with open(path, "w") as f:
            f.write(self.to_json())

    @classmethod
    def load(cls, path: str) -> "KMeansModel":
        """Load from a JSON file, or from a release directory (its ``_kmeans_model.json``)."""
        p = path[len("file:"):] if path.startswith("file:") else path
        if os.path.isdir(p):
            p = os.path.join(p, MODEL_FILE)
        try:
            with open(p) as f:
                return cls.from_dict(json.load(f))
        except OSError as exc:
            raise ParameterError(f"Cannot read the k-means model {path!r}: {exc.strerror}.") from None
