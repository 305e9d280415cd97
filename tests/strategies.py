"""Hypothesis strategies for (draft p, target q) pairs with the edge cases that matter.

Every strategy yields float64 numpy vectors that sum to 1 within 1e-12:
zeros in either vector, disjoint supports, p == q, point masses, n == 1,
tied ratios and probabilities down to 1e-300.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

__all__ = ["distributions", "pairs", "special_pairs"]


def _normalise(w):
    w = np.asarray(w, dtype=np.float64)
    return w / w.sum()


@st.composite
def distributions(draw, n: int, *, allow_zeros: bool = True, tiny: bool = True):
    """A distribution on ``n`` tokens; weights from a mixture of scales."""
    elems = st.one_of(
        st.floats(min_value=0.01, max_value=1.0),
        st.sampled_from([1.0, 0.5, 0.25]),  # produces ties
        st.floats(min_value=1e-300, max_value=1e-6) if tiny else st.floats(min_value=0.01, max_value=1.0),
        st.just(0.0) if allow_zeros else st.floats(min_value=0.01, max_value=1.0),
    )
    w = draw(st.lists(elems, min_size=n, max_size=n))
    if sum(w) <= 0:
        w[draw(st.integers(0, n - 1))] = 1.0
    return _normalise(w)


@st.composite
def special_pairs(draw, n: int):
    """Structured edge cases: p == q, point masses, disjoint supports, uniform."""
    kind = draw(st.sampled_from(["equal", "point", "disjoint", "uniform", "point-vs-any"]))
    if kind == "equal":
        p = draw(distributions(n))
        return p, p.copy()
    if kind == "point":
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        return np.eye(n)[i], np.eye(n)[j]
    if kind == "disjoint" and n >= 2:
        cut = draw(st.integers(1, n - 1))
        p = np.zeros(n)
        q = np.zeros(n)
        p[:cut] = 1.0 / cut
        q[cut:] = 1.0 / (n - cut)
        return p, q
    if kind == "point-vs-any":
        return np.eye(n)[draw(st.integers(0, n - 1))], draw(distributions(n))
    return np.full(n, 1.0 / n), draw(distributions(n))


@st.composite
def pairs(draw, min_n: int = 1, max_n: int = 5):
    """A (p, q) pair on a common vocabulary of size in [min_n, max_n]."""
    n = draw(st.integers(min_n, max_n))
    if draw(st.integers(0, 3)) == 0:
        return draw(special_pairs(n))
    return draw(distributions(n)), draw(distributions(n))
