"""The released k-means model: only public things (no data, no secrets).

It holds the noisy centres in input space, the noisy counts, the declared
bounds, and for the ``kernel`` variant the public frequency matrix ``W``, the
kernel width and the noisy feature-space centres, so that new points can be
assigned without touching the private table again. ``predict`` is numpy;
``assign`` runs the same function over a Spark DataFrame.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import ParameterError

__all__ = ["KMeansModel", "MODEL_FORMAT", "MODEL_FILE"]

MODEL_FORMAT = "sparkpriv.kmeans-model/1"
MODEL_FILE = "_kmeans_model.json"


@dataclass
class KMeansModel:
    """A released DP k-means clustering.

    Attributes
    ----------
    variant : {"linear", "kernel"}
    centers : ndarray of shape (k, n_features)
        Noisy centres in input space.
    counts : ndarray of shape (k,)
        Noisy cluster sizes of the step that produced ``centers``.
    bounds : dict
        The declared bounds (public) used to clip inputs before assignment.
    W : ndarray of shape (frequencies, n_features) or None
        Public random Fourier frequencies (``kernel``).
    kernel_width : float or None
    feature_centers : ndarray of shape (k, 2 frequencies) or None
        Noisy centres in feature space (``kernel``); assignment uses these.
    """

    variant: str
    centers: np.ndarray
    counts: np.ndarray
    bounds: dict
    W: np.ndarray | None = None
    kernel_width: float | None = None
    feature_centers: np.ndarray | None = None

    @property
    def k(self) -> int:
        return int(np.asarray(self.centers).shape[0])

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

    def predict(self, X) -> np.ndarray:
        """Cluster index of each row of ``X`` (n_samples, n_features): clip, map, nearest centre."""
        from sparkpriv.mechanisms.kmeans import assign_nearest

        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.centers.shape[1]:
            raise ParameterError(
                f"X must have shape (n_samples, {self.centers.shape[1]}). Got {X.shape} instead."
            )
        Z, _, _ = self.feature_map().features(X)
        return assign_nearest(Z, self.assignment_centers())

    def assign(self, df, *, columns, keep_columns=(), output_column: str = "cluster", fill=None):
        """``df`` with a ``cluster`` column (Spark; the same function as :meth:`predict`)."""
        from sparkpriv.spark.kmeans import assign_clusters

        return assign_clusters(df, self, columns=columns, keep_columns=keep_columns,
                               output_column=output_column, fill=fill)

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
        }

    @classmethod
    def from_dict(cls, d: dict) -> "KMeansModel":
        if d.get("format") != MODEL_FORMAT:
            raise ParameterError(f"Not a sparkpriv k-means model (format {d.get('format')!r}).")

        def arr(a):
            return None if a is None else np.asarray(a, dtype=np.float64)

        return cls(d["variant"], arr(d["centers"]), arr(d["counts"]), d["bounds"], arr(d["W"]),
                   d["kernel_width"], arr(d["feature_centers"]))

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
