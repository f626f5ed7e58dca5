import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.privacy.bounds import Bounds, clip_rows


def test_box_then_norm_clip_and_counts():
    b = Bounds(3, (-1.0, -1.0, -1.0), (1.0, 1.0, 1.0), row_bound=1.0)
    X = np.array([[0.1, 0.2, 0.3], [5.0, 0.0, 0.0], [0.9, 0.9, 0.9], [-3.0, 3.0, 0.0]])
    Y, c = clip_rows(X, b)
    assert c.rows == 4 and c.box_clipped == 2 and c.norm_clipped == 2
    np.testing.assert_allclose(Y[0], X[0])
    np.testing.assert_allclose(Y[1], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1).max(), 1.0)
    np.testing.assert_allclose(Y[3], np.array([-1.0, 1.0, 0.0]) / np.sqrt(2))
    assert not np.shares_memory(X, Y)


def test_l1_norm_clip():
    b = Bounds(2, row_bound=1.0, norm="l1")
    Y, c = clip_rows(np.array([[3.0, 1.0]]), b)
    np.testing.assert_allclose(Y, [[0.75, 0.25]])
    assert c.norm_clipped == 1


def test_change_constraints():
    b = Bounds(2, (0.0, 0.0), (1.0, 2.0), row_bound=1.5)
    # origin inside the box -> both the box and the norm ball bound the change
    cc = b.change_constraints("replace-one")
    assert cc["l2_radius"] == 3.0
    np.testing.assert_allclose(cc["box_widths"], [1.0, 2.0])
    cc = b.change_constraints("add-remove")
    assert cc["l2_radius"] == 1.5
    # element-wise: the box widths; a row norm clip is refused (it spreads one attribute's change)
    box = Bounds(2, (0.0, 0.0), (1.0, 2.0))
    np.testing.assert_allclose(box.change_constraints("element")["element_widths"], [1.0, 2.0])
    with pytest.raises(ParameterError, match="row_bound"):
        b.change_constraints("element")
    # origin outside the box: the norm clip can leave the box, so only the norm bound counts
    b2 = Bounds(2, (1.0, 1.0), (2.0, 2.0), row_bound=2.0)
    assert "box_widths" not in b2.change_constraints("replace-one")


@pytest.mark.parametrize("kw,msg", [
    ({"lower": (0.0, 0.0)}, "go together"),
    ({"lower": (0.0,), "upper": (1.0,)}, "one value per column"),
    ({"lower": (1.0, 0.0), "upper": (0.0, 1.0)}, "must exceed"),
    ({"row_bound": -1.0}, "row_bound"),
    ({"norm": "linf", "row_bound": 1.0}, "norm"),
])
def test_bad_bounds(kw, msg):
    with pytest.raises(ParameterError, match=msg):
        Bounds(2, **kw)


def test_missing_bounds_message():
    with pytest.raises(ParameterError, match="declared public bounds"):
        Bounds(2).require_any("release_projection")
