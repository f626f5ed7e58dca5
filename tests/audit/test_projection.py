"""Audit of the JL projection release: dense rows and event-table (sparse) records.

Dense rows go through the public ``release_projection_array`` (the projection
mechanism on the local engine) with a known
``matrix_key`` (so the auditor knows ``P``): one call releases ``n`` copies of
the same row, i.e. ``n`` independent runs of the mechanism on that record
(every row gets its own noise; the other rows of a table do not change the
distribution of this one). Worst-case rows are computed by the auditor's own
search over ``P`` (sign enumeration, vertices of the box) and given OUTSIDE the
declared bounds, so the release's clipping is what maps them onto the
worst-case pair. Event records go through the mechanism's calibration
(``plan_sparse_projection``) and its records row map (``_sparse_row_map``: the
sparse projection and the keyed noise both engines run).

Relations audited: replace-one with an L2, an L1 or a box bound; element with a
box or an ``element_bound``. Not audited (refused by the library):
add-remove for row-level releases, element with a row norm bound.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.api import release_projection_array
from sparkpriv.mechanisms.projection import _sparse_row_map, plan_projection, secret_matrix_and_seed
from sparkpriv.mechanisms.protocol import SparseRows
from sparkpriv.mechanisms.sparse import ItemCap, plan_sparse_projection
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.calibration import gdp_mu_for

from ._audit import (
    N_GAUSS,
    N_LAPLACE,
    check,
    gaussian_game,
    grid_integers,
    laplace_game,
    sign_vectors,
    weaken_noise,
)

pytestmark = pytest.mark.audit

D, K = 4, 3
KEY = b"sparkpriv-audit: projection key 01"
EPS_LAPLACE = 1.0
EPS_GAUSS, DELTA = 1.0, 1e-3
LO = np.array([-1.0, -2.0, 0.0, -0.5])
HI = np.array([1.0, 1.0, 2.0, 0.5])
R = 1.5
ELEMENT_BOUND = 0.75

# (relation, bound kind) pairs offered for dense rows, audited for both noises
DENSE_CASES = [
    ("replace-one", "l2"),
    ("replace-one", "l1"),
    ("replace-one", "box"),
    ("element", "box"),
    ("element", "element_bound"),
]


def matrix() -> np.ndarray:
    return secret_matrix_and_seed(D, K, KEY)[0]


def bound_kwargs(kind: str) -> dict:
    return {
        "l2": {"row_bound": R, "norm": "l2"},
        "l1": {"row_bound": R, "norm": "l1"},
        "box": {"lower": LO, "upper": HI},
        "element_bound": {"element_bound": ELEMENT_BOUND},
    }[kind]


def worst_pair(P: np.ndarray, relation: str, kind: str, noise: str):
    """The auditor's worst-case neighbours ``(x, x')`` (already inside the bounds)
    and the inputs given to the release (outside them where clipping applies)."""
    l1 = noise == "laplace"
    if relation == "element":
        rows = np.abs(P).sum(axis=1) if l1 else np.linalg.norm(P, axis=1)
        if kind == "box":
            i = int(np.argmax((HI - LO) * rows))
            x = LO.copy()
            xp = LO.copy()
            xp[i] = HI[i]
        else:
            i = int(np.argmax(rows))
            x = np.zeros(D)
            xp = np.zeros(D)
            xp[i] = ELEMENT_BOUND
        return x, xp, x, xp
    if kind == "l2":
        if l1:  # ||v P||_1 over the ball: v along P s for the best sign vector s
            S = sign_vectors(K)
            w = P @ S[int(np.argmax(np.linalg.norm(P @ S.T, axis=0)))]
        else:  # ||v P||_2: the top left singular vector
            w = np.linalg.svd(P)[0][:, 0]
        x = R * w / np.linalg.norm(w)
        return x, -x, 2.5 * x, -2.5 * x
    if kind == "l1":
        rows = np.abs(P).sum(axis=1) if l1 else np.linalg.norm(P, axis=1)
        x = np.zeros(D)
        x[int(np.argmax(rows))] = R
        return x, -x, 3.0 * x, -3.0 * x
    # box: the best vertex pair (the auditor's own search)
    if l1:
        S = sign_vectors(K)
        s = S[int(np.argmax(np.abs(P @ S.T).T @ (HI - LO)))]
        up = (P @ s) > 0
    else:
        V = sign_vectors(D) > 0  # which coordinates sit at the upper bound in x
        diffs = np.where(V, HI - LO, LO - HI) @ P
        up = V[int(np.argmax(np.linalg.norm(diffs, axis=1)))]
    x = np.where(up, HI, LO)
    xp = np.where(up, LO, HI)
    far = np.where(up, HI + 1.0, LO - 1.0)
    farp = np.where(up, LO - 1.0, HI + 1.0)
    return x, xp, far, farp


def dense_release(x_in: np.ndarray, n: int, relation: str, kind: str, noise: str):
    eps = EPS_LAPLACE if noise == "laplace" else EPS_GAUSS
    delta = 0.0 if noise == "laplace" else DELTA
    X = np.broadcast_to(x_in, (n, D)).copy()
    # the rows get independent noise; its seed comes from the fixed test seed (fixture)
    rel = release_projection_array(X, k=K, epsilon=eps, delta=delta, noise=noise, neighbors=relation,
                                   matrix_key=KEY, **bound_kwargs(kind))
    return rel


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("relation,kind", DENSE_CASES)
def test_dense_projection_laplace(relation, kind, control, monkeypatch, test_seed):
    if control:
        weaken_noise(monkeypatch)
    P = matrix()
    x, xp, x_in, xp_in = worst_pair(P, relation, kind, "laplace")
    rel = dense_release(x_in, N_LAPLACE, relation, kind, "laplace")
    rel_p = dense_release(xp_in, N_LAPLACE, relation, kind, "laplace")
    g = rel.plan.noise.grid
    assert rel_p.plan.noise == rel.plan.noise
    u = np.rint((x @ P) / g).astype(np.int64)
    up = np.rint((xp @ P) / g).astype(np.int64)
    res = laplace_game(f"projection dense laplace {relation} {kind}", grid_integers(rel.to_numpy(), g),
                       grid_integers(rel_p.to_numpy(), g), u, up, EPS_LAPLACE, control=control)
    if not control:
        assert rel.epsilon <= EPS_LAPLACE  # the accounted epsilon never exceeds the request
    check(res)


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("relation,kind", DENSE_CASES)
def test_dense_projection_gaussian(relation, kind, control, monkeypatch, test_seed):
    if control:
        weaken_noise(monkeypatch)
    P = matrix()
    x, xp, x_in, xp_in = worst_pair(P, relation, kind, "gaussian")
    rel = dense_release(x_in, N_GAUSS, relation, kind, "gaussian")
    rel_p = dense_release(xp_in, N_GAUSS, relation, kind, "gaussian")
    nzo = rel.plan.noise
    assert rel_p.plan.noise == nzo
    g = nzo.grid
    u = np.rint((x @ P) / g).astype(np.int64)
    up = np.rint((xp @ P) / g).astype(np.int64)
    if not control:
        assert rel.epsilon <= EPS_GAUSS  # the accounted epsilon never exceeds the request
    mu_claim = gdp_mu_for(EPS_GAUSS, DELTA)
    res = gaussian_game(f"projection dense gaussian {relation} {kind}", grid_integers(rel.to_numpy(), g),
                        grid_integers(rel_p.to_numpy(), g), u, up, nzo.sigma, EPS_GAUSS, DELTA, mu_claim,
                        control=control)
    check(res)


def test_dense_gaussian_noise_is_the_analytic_gaussian():
    """The Gaussian projection's per-entry noise equals the analytic Gaussian
    calibration (Balle & Wang) for the realized L2 sensitivity, to the grid's
    ``sqrt(k)`` rounding term (relative < 1e-9 at this grid), and never less."""
    from sparkpriv.privacy.calibration import calibrate_analytic_gaussian

    P = matrix()
    plan = plan_projection(P, Bounds(D, row_bound=R), epsilon=EPS_GAUSS, delta=DELTA, noise="gaussian")
    ref = calibrate_analytic_gaussian(sensitivity=2 * R * np.linalg.norm(P, 2), epsilon=EPS_GAUSS, delta=DELTA)
    got = plan.noise.sigma * plan.noise.grid
    assert ref <= got <= ref * (1 + 1e-9)


# ----------------------------------------------------------------------------- event records

D_VOCAB = 256
CAPS = {
    "binary": ItemCap(1, "binary"),
    "counts": ItemCap(1, "counts", 4),
}


def records_pair(P: np.ndarray, noise: str):
    """Two one-item records ``(i, j)`` whose change ``P_i - P_j`` is largest (the
    auditor's search; with L = 1 a record is one item)."""
    if noise == "laplace":  # max_{i,j} ||P_i - P_j||_1 = max_s (max_i <P_i, s> - min_j <P_j, s>)
        Y = P @ sign_vectors(P.shape[1]).T
        best = int(np.argmax(Y.max(axis=0) - Y.min(axis=0)))
        return int(np.argmax(Y[:, best])), int(np.argmin(Y[:, best]))
    G = np.linalg.norm(P[:, None, :] - P[None, :, :], axis=2)
    i, j = np.unravel_index(int(np.argmax(G)), G.shape)
    return int(i), int(j)


def records_release(item: int, n: int, cap: ItemCap, plan, P, seed: int) -> np.ndarray:
    offsets = np.arange(n + 1, dtype=np.int64)
    indices = np.full(n, item, dtype=np.int32)
    values = None if cap.weights == "binary" else np.full(n, cap.value_cap)
    # the mechanism's own row map (what both engines run), one block of partition 0
    row_map = _sparse_row_map(P, plan.noise, seed, plan.value_bound)
    (cols,) = list(row_map(0, iter([SparseRows(offsets, indices, values, P.shape[0])])))
    return np.column_stack(cols)


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("weights", ["binary", "counts"])
def test_event_records_projection(weights, noise, control, monkeypatch):
    if control:
        weaken_noise(monkeypatch)
    cap = CAPS[weights]
    P = secret_matrix_and_seed(D_VOCAB, K, KEY)[0]
    lap = noise == "laplace"
    eps, delta = (EPS_LAPLACE, 0.0) if lap else (EPS_GAUSS, DELTA)
    plan = plan_sparse_projection(P, cap, epsilon=eps, delta=delta, noise=noise, neighbors="replace-one")
    i, j = records_pair(P, noise)
    n = N_LAPLACE if lap else N_GAUSS
    g = plan.noise.grid
    c = cap.value_cap
    u = np.rint(c * P[i] / g).astype(np.int64)
    up = np.rint(c * P[j] / g).astype(np.int64)
    I_d = grid_integers(records_release(i, n, cap, plan, P, 11), g)
    I_dp = grid_integers(records_release(j, n, cap, plan, P, 12), g)
    name = f"projection events {noise} replace-one {weights} L=1"
    if lap:
        res = laplace_game(name, I_d, I_dp, u, up, eps, control=control)
    else:
        res = gaussian_game(name, I_d, I_dp, u, up, plan.noise.sigma, eps, delta, gdp_mu_for(eps, delta),
                            control=control)
    check(res)
