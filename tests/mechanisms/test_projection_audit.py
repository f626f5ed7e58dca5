"""Privacy-audit fixes of the projection release (numpy path).

* element-wise neighbours refuse a whole-row clip; the box / element_bound
  sensitivity is checked by brute force over pairs of neighbouring records;
* add-remove is refused by every row-level release before any data is read;
* no data value can make a release fail (projected values are clamped to a
  public range);
* bad input: overflowing row norms, complex input, a single lower/upper
  value, NaN (InputError on every path).
"""

import itertools

import numpy as np
import pytest

from sparkpriv.api import release_projection_array
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.api import release_dprp_array
from sparkpriv.mechanisms.projection import (
    draw_projection_matrix,
    plan_projection,
    project_rows,
)
from sparkpriv.privacy.bounds import Bounds, clip_rows, row_norms


class _Untouchable:
    """Input that fails the test if anything reads it."""

    def __array__(self, *a, **k):
        raise AssertionError("the data was read")

    def __getattr__(self, name):
        raise AssertionError(f"the data was read ({name})")


# --------------------------------------------------------------------------- defect 1

@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
@pytest.mark.parametrize("extra", [{}, {"lower": -1.0, "upper": 1.0}, {"element_bound": 0.5},
                                   {"norm": "l1"}])
def test_element_with_row_bound_is_refused(noise, delta, extra):
    with pytest.raises(ParameterError, match=r"row_bound.*neighbors='element'.*whole row.*lower/upper"):
        release_projection_array(np.ones((4, 8)), k=2, epsilon=1.0, delta=delta, noise=noise,
                                 neighbors="element", row_bound=1.0, **extra)


def test_element_with_row_bound_is_refused_by_the_plan():
    P = draw_projection_matrix(8, 3, seed=1)
    with pytest.raises(ParameterError, match="row_bound"):
        plan_projection(P, Bounds(8, element_bound=1.0, row_bound=1.0), epsilon=1.0, neighbors="element")


def test_row_clip_breaks_the_element_wise_sensitivity():
    """Why the combination is refused: the composed map (norm clip, then project)
    moves further than ``L max_i ||P_i||_1`` for one attribute changed by ``L``:
    the rescaling spreads the change over every coordinate."""
    d, L, R = 8, 1.0, 1.0
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=d)))
    X = signs * R / np.sqrt(d)  # on the sphere, every sign pattern
    b = Bounds(d, row_bound=R)
    worst_ratio = 0.0
    for seed in range(5):
        P = draw_projection_matrix(d, 3, seed=seed)
        claimed = L * np.abs(P).sum(axis=1).max()
        for i in range(d):
            for t in (L, -L):
                Xp = X.copy()
                Xp[:, i] += t
                diff = clip_rows(X, b)[0] - clip_rows(Xp, b)[0]
                worst_ratio = max(worst_ratio, np.abs(diff @ P).sum(axis=1).max() / claimed)
    assert worst_ratio > 1.05


def _pairs(d, grid, steps):
    """Every x on ``grid^d`` and x' = x + t e_i for every coordinate i and step t."""
    X = np.array(list(itertools.product(grid, repeat=d)))
    A, B = [], []
    for i in range(d):
        for t in steps:
            Xp = X.copy()
            Xp[:, i] += t
            A.append(X)
            B.append(Xp)
    return np.concatenate(A), np.concatenate(B)


@pytest.mark.parametrize("element_bound", [None, 0.7, 5.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_element_box_sensitivity_by_brute_force(element_bound, seed):
    d, k = 3, 2
    lower, upper = (-1.0, 0.0, -0.25), (1.0, 2.0, 0.25)
    bounds = Bounds(d, lower, upper, element_bound=element_bound)
    widths = np.subtract(upper, lower)
    L = widths.max() if element_bound is None else element_bound
    P = draw_projection_matrix(d, k, seed=seed)
    grid = np.union1d(np.linspace(-2.5, 2.5, 11), lower + upper)  # inside, outside and on the box
    steps = np.linspace(-L, L, 9)
    X, Xp = _pairs(d, grid, steps)
    # element_bound=None: each attribute changes by at most its own box width
    if element_bound is None:
        keep = np.abs(Xp - X).max(axis=1) <= widths[np.argmax(np.abs(Xp - X), axis=1)] + 1e-12
        X, Xp = X[keep], Xp[keep]
    Y, _ = project_rows(X, P, bounds)
    Yp, _ = project_rows(Xp, P, bounds)
    worst_l1 = np.abs(Y - Yp).sum(axis=1).max()
    worst_l2 = np.linalg.norm(Y - Yp, axis=1).max()
    lap = plan_projection(P, bounds, epsilon=1.0, neighbors="element")
    gau = plan_projection(P, bounds, epsilon=1.0, delta=1e-6, noise="gaussian", neighbors="element")
    assert worst_l1 <= lap.sensitivity * (1 + 1e-12)
    assert worst_l2 <= gau.sensitivity * (1 + 1e-12)
    # and the receipt's sensitivity is attained (the box makes it min(L, w_i) per attribute)
    assert worst_l1 >= lap.sensitivity * (1 - 1e-12)
    assert worst_l2 >= gau.sensitivity * (1 - 1e-12)


# --------------------------------------------------------------------------- defect 2

@pytest.mark.parametrize("kw", [{"row_bound": 1.0}, {"lower": 0.0, "upper": 1.0}])
def test_add_remove_refused_before_the_data_is_read(kw):
    with pytest.raises(ParameterError, match=r"'neighbors'.*'add-remove'.*number of output rows.*replace-one"):
        release_projection_array(_Untouchable(), k=2, epsilon=1.0, neighbors="add-remove", **kw)


def test_add_remove_refused_by_dprp_rows_before_the_data_is_read():
    with pytest.raises(ParameterError, match=r"'add-remove'.*DPRP.*replace-one"):
        release_dprp_array(_Untouchable(), epsilon=1.0, delta=1e-6, lower=0.0, upper=1.0,
                           neighbors="add-remove")


# --------------------------------------------------------------------------- defect 3

@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
@pytest.mark.parametrize("huge", [1e30, -1e300, 1.7e308])
def test_huge_value_with_element_bound_alone_is_clamped_not_an_error(noise, delta, huge):
    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, size=(50, 6))
    X[7, 2] = huge
    rel = release_projection_array(X, k=3, epsilon=1.0, delta=delta, noise=noise, neighbors="element",
                                   element_bound=1.0)
    M = rel.plan.value_bound
    assert np.isfinite(M) and M <= rel.plan.noise.max_abs_value
    assert np.isfinite(rel.to_numpy()).all()
    # the huge row is clamped to the public range (plus noise); the others are untouched by it
    assert np.abs(rel.to_numpy()[7]).max() <= M + 60 * rel.plan.noise.std
    assert np.abs(np.delete(rel.to_numpy(), 7, axis=0)).max() < 1e3
    pub = rel.plan.to_public_dict()["projected_value_range"]
    assert pub["bound"] == M and "no declared box" in pub["source"]


def test_default_range_is_public_and_wide():
    # the range depends only on public quantities (sensitivity, epsilon): 2^28 noise std
    P = draw_projection_matrix(6, 3, seed=3)
    plan = plan_projection(P, Bounds(6, element_bound=1.0), epsilon=1.0, neighbors="element")
    assert plan.value_bound == pytest.approx(2.0**28 * plan.noise.std, rel=1e-6)


def test_clamping_keeps_element_wise_neighbours_within_the_sensitivity():
    """The clamps act on one coordinate at a time: neighbours at the edge of the
    range still move by at most the sensitivity."""
    d, k = 4, 2
    P = draw_projection_matrix(d, k, seed=9)
    b = Bounds(d, element_bound=1.0)
    plan = plan_projection(P, b, epsilon=1.0, neighbors="element")
    c = plan.value_bound / np.abs(P).sum(axis=0).max()
    base = np.array([[c - 0.3, -c + 0.2, 1e200, 0.0]])
    worst = 0.0
    for i in range(d):
        for t in np.linspace(-1, 1, 21):
            xp = base.copy()
            xp[0, i] += t
            y, _ = project_rows(base, P, b, plan.value_bound)
            yp, _ = project_rows(xp, P, b, plan.value_bound)
            worst = max(worst, np.abs(y - yp).sum())
    # floating point: values near the range M = 4e8 carry rounding errors of about M * 2^-52
    assert worst <= plan.sensitivity + 1e-6


@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
def test_box_release_with_huge_values_succeeds(noise, delta):
    X = np.ones((20, 5))
    X[3] = 1e300
    rel = release_projection_array(X, k=2, epsilon=1.0, delta=delta, noise=noise, lower=[-1.0] * 5,
                                   upper=[1.0] * 5)
    assert np.isfinite(rel.to_numpy()).all()


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("norm", ["l2", "l1"])
def test_overflowing_row_norm_is_clipped_in_its_direction(norm):
    X = np.array([[1e200, -2e200, 0.0, 3e200], [0.5, 0.0, 0.0, 0.0], [1.7e308, 1.7e308, 0.0, 0.0]])
    direction = np.array([1.0, -2.0, 0.0, 3.0])
    ref = np.linalg.norm(direction) if norm == "l2" else np.abs(direction).sum()
    Y, c = clip_rows(X, Bounds(4, row_bound=2.0, norm=norm))
    np.testing.assert_allclose(Y[0], 2.0 * direction / ref, rtol=1e-12)
    np.testing.assert_array_equal(Y[1], X[1])
    r = np.sqrt(2.0) if norm == "l2" else 2.0
    np.testing.assert_allclose(Y[2], [2.0 / r, 2.0 / r, 0.0, 0.0], rtol=1e-12)
    assert c.norm_clipped == 2
    np.testing.assert_allclose(row_norms(X[:1], norm), [1e200 * ref], rtol=1e-12)


def test_overflowing_row_norm_within_a_huge_bound_is_unchanged():
    X = np.array([[1e200, 1e200]])
    Y, c = clip_rows(X, Bounds(2, row_bound=1e300))
    np.testing.assert_array_equal(Y, X)
    assert c.norm_clipped == 0


def test_release_of_overflowing_rows_is_not_zeros():
    X = np.zeros((3, 4))
    X[0] = [1e200, 0.0, 0.0, 0.0]
    X[1] = [0.0, 0.0, 1e200, 0.0]
    # a fixed public matrix: with a fresh one, ||P e_2|| fell below 0.2 once in a CI run (chi^2_4 / 4
    # below 0.04 has probability about 0.3%)
    rel = release_projection_array(X, k=4, epsilon=1e6, row_bound=1.0, matrix_key=b"overflow-test-key")
    # with negligible noise the released rows are the projections of e_0 and e_2 (norm ~ 1)
    assert np.linalg.norm(rel.to_numpy()[0]) > 0.2 and np.linalg.norm(rel.to_numpy()[1]) > 0.2
    assert np.linalg.norm(rel.to_numpy()[2]) < 1e-3


def test_complex_input_is_refused():
    with pytest.raises(InputError, match="real"):
        release_projection_array(np.ones((4, 3)) + 1j, k=2, epsilon=1.0, row_bound=1.0)


def test_single_lower_upper_value_for_all_columns():
    P_key = b"0123456789abcdef-key"
    X = np.random.default_rng(0).uniform(-3, 3, size=(30, 5))
    one = release_projection_array(X, k=2, epsilon=1.0, lower=-1.0, upper=2.0, matrix_key=P_key)
    many = release_projection_array(X, k=2, epsilon=1.0, lower=[-1.0] * 5, upper=[2.0] * 5, matrix_key=P_key)
    assert one.plan.bounds == many.plan.bounds
    assert one.plan.sensitivity == many.plan.sensitivity
    assert one.diagnostics() == many.diagnostics()
    with pytest.raises(ParameterError, match="'lower'.*one value per column"):
        release_projection_array(X, k=2, epsilon=1.0, lower=[-1.0, 0.0], upper=2.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_values_take_the_centre_of_the_box(bad):
    from sparkpriv.privacy.random import insecure_fixed_seed

    X = np.ones((4, 3))
    X[1, 2] = bad
    with insecure_fixed_seed(5):
        a = release_projection_array(X, k=2, epsilon=1.0, lower=-1.0, upper=3.0)
    X[1, 2] = 1.0  # the centre of [-1, 3]
    with insecure_fixed_seed(5):
        b = release_projection_array(X, k=2, epsilon=1.0, lower=-1.0, upper=3.0)
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
