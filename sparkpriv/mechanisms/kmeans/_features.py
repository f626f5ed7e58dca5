"""DP k-means' feature maps: the linear variant's clipped rows and the kernel variant's paired
random Fourier features (docs/math.md section 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy.bounds import Bounds, ClipCounts, clip_rows
from sparkpriv.privacy.random import new_secret_seed, stream


VARIANTS = ("linear", "kernel")
MAX_ROWS = 2**34  # public cap on n that fixes the noise grid (see module docstring)
ITER_STAGE = 11  # public label of the driver noise stream of iteration t: (seed, ITER_STAGE, t)
FINAL_STAGE = 12
C_ROUNDING = 1.0 + 1e-12  # RFF norm bound covering float rounding of cos^2 + sin^2
DEFAULT_RELIABILITY_STDS = 3.0  # a cluster whose noisy size is below 3 noise stds is "unreliable"
_POS = Interval("real", 0, None, "neither")


def draw_frequencies(d: int, frequencies: int, kernel_width: float, seed: int) -> np.ndarray:
    """``W`` (frequencies, d) with i.i.d. ``N(0, 1/kernel_width^2)`` entries (public)."""
    return stream(seed, 0).standard_normal((frequencies, d)) / float(kernel_width)


def rff_features(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Paired random Fourier features ``[cos(X W^T), sin(X W^T)] / sqrt(D)``, shape (n, 2D).

    Every row has L2 norm 1 (up to float rounding).
    """
    return _rff_of_projection(X @ W.T)


def _rff_of_projection(P: np.ndarray) -> np.ndarray:
    """``[cos(P), sin(P)] / sqrt(D)`` for the projections ``P = X W^T`` (n, D)."""
    D = P.shape[1]
    Z = np.empty((P.shape[0], 2 * D), dtype=np.float64)
    np.cos(P, out=Z[:, :D])
    np.sin(P, out=Z[:, D:])
    Z *= 1.0 / math.sqrt(D)
    return Z


def input_norm_bound(bounds: Bounds) -> float:
    """L2 bound ``C_x`` on a clipped row: min(row_bound, the box's largest norm).

    An L1 row bound also bounds the L2 norm. After the box clip and the norm
    clip (which only shrinks a row) both bounds hold.
    """
    c = math.inf
    if bounds.row_bound is not None:
        c = float(bounds.row_bound)
    if bounds.has_box:
        far = np.maximum(np.abs(np.asarray(bounds.lower, float)), np.abs(np.asarray(bounds.upper, float)))
        c = min(c, float(np.sqrt(np.sum(far * far))) * (1.0 + 1e-12))
    return c


@dataclass(frozen=True)
class FeatureMap:
    """The public map from an input row to its Lloyd feature vector."""

    variant: str
    bounds: Bounds
    W: np.ndarray | None = None  # (D, d), kernel only
    kernel_width: float | None = None

    @property
    def d(self) -> int:
        return self.bounds.dim

    @property
    def dim(self) -> int:
        """Feature dimension ``D'`` (d for linear, 2D for kernel)."""
        return self.d if self.W is None else 2 * self.W.shape[0]

    @property
    def feature_bound(self) -> float:
        """``C``: the L2 bound on one feature vector."""
        return input_norm_bound(self.bounds) if self.variant == "linear" else C_ROUNDING

    def clip(self, X: np.ndarray) -> tuple[np.ndarray, ClipCounts]:
        return clip_rows(X, self.bounds)

    def from_clipped(self, Xc: np.ndarray) -> np.ndarray:
        return Xc if self.W is None else rff_features(Xc, self.W)

    def project(self, centres: np.ndarray) -> np.ndarray:
        """Feature-space centres (k, D') projected onto the feature domain (post-processing).

        ``linear``: the rows' own clip (box, then row-bound ball), so a centre
        lies where a clipped row can; ``kernel``: scaled onto the ball of
        radius 1 that holds every mean of unit feature vectors.
        """
        if self.W is None:
            return self.clip(centres)[0]
        return project_to_ball(centres, 1.0)

    def features(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, ClipCounts]:
        """``(Z, Xc, counts)``: features, clipped inputs and clipping counts of ``X`` (n, d)."""
        Xc, counts = self.clip(X)
        return self.from_clipped(Xc), Xc, counts

    def features_sparse(self, offsets, indices, values) -> np.ndarray:
        """Kernel features of sparse records (CSR parts; ``values`` None = binary), never
        densified: ``X W^T`` is the (weighted) sum of the columns of ``W`` at each
        record's items. The records must already satisfy the bounds (capped records do)."""
        from sparkpriv.mechanisms.sparse import project_sparse_rows

        if self.W is None:
            raise ParameterError("Sparse records have kernel features only (variant='kernel').")
        return _rff_of_projection(project_sparse_rows(offsets, indices, values, self.W.T))


def _kernel_width_required(caller: str) -> ParameterError:
    return ParameterError(
        f"The 'kernel_width' parameter of {caller} is required for variant='kernel': give the "
        "public RBF width s of exp(-||x-y||^2 / (2 s^2)) (--kernel-width), e.g. about the "
        "typical distance between two points of one cluster."
    )


def make_feature_map(variant: str, bounds: Bounds, *, kernel_width=None, frequencies: int = 128,
                     seed: int | None = None, caller: str = "release_kmeans") -> FeatureMap:
    check_param("variant", variant, [Options(VARIANTS)], caller)
    if variant == "linear":
        return FeatureMap("linear", bounds)
    if kernel_width is None:
        raise _kernel_width_required(caller)
    check_param("kernel_width", kernel_width, [_POS], caller)
    check_param("frequencies", frequencies, [Interval("integer", 1, 100_000, "both")], caller)
    seed = new_secret_seed("kmeans-frequencies") if seed is None else seed
    W = draw_frequencies(bounds.dim, frequencies, kernel_width, seed)
    return FeatureMap("kernel", bounds, W, float(kernel_width))


def project_to_ball(centres: np.ndarray, radius: float) -> np.ndarray:
    """Rows of ``centres`` whose L2 norm exceeds ``radius`` scaled onto the ball (a copy)."""
    P = np.array(centres, dtype=np.float64, copy=True)
    norms = np.linalg.norm(P, axis=1)
    over = norms > radius
    P[over] *= (radius / norms[over])[:, None]
    return P
