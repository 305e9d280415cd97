r"""Hypothesis strategies for property-based tests of speculative samplers (needs the ``test`` extra).

* :func:`distributions` -- a distribution on ``n`` tokens with zeros, ties and
  entries down to 1e-300;
* :func:`pairs` -- (draft ``p``, target ``q``) pairs with adversarial
  structure: zeros on either side, disjoint supports, ties, point masses,
  1e-300 entries, ``p == q``, and (``near_equal=True``) pairs equal up to
  relative perturbations of 1e-12 .. 1e-3;
* :func:`special_pairs` -- the structured cases alone;
* :func:`sampling_laws` -- logits with sampling parameters (temperature,
  top-k, top-p) together with the processed law
  (:func:`otspec.testing.processed_law`).

Every vector is float64 and sums to 1 within 1e-12. Import this module only
in tests: ``import otspec.testing`` itself does not need hypothesis.

Notation: ``p`` is the draft distribution, ``q`` the target.

Examples
--------
>>> from hypothesis import given, settings
>>> from otspec.testing.strategies import pairs
>>> @settings(max_examples=20, derandomize=True)
... @given(pairs(max_n=4))
... def test_sums(pq):
...     assert abs(pq[0].sum() - 1) < 1e-12 and abs(pq[1].sum() - 1) < 1e-12
>>> test_sums()
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._deps import install_hint

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "otspec.testing.strategies needs hypothesis, a test-only dependency: "
        f"{install_hint('test')} (or pip install hypothesis)"
    ) from exc

from ._logits import processed_law

__all__ = ["SamplingLaw", "distributions", "pairs", "sampling_laws", "special_pairs"]


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
def _near_equal(draw, n: int):
    """``p`` and ``q = p`` perturbed by relative noise of 1e-12 .. 1e-3 on its support."""
    p = draw(distributions(n))
    scale = draw(st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3]))
    signs = np.array(draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=n, max_size=n)))
    q = _normalise(p * (1.0 + scale * signs))
    return (p, q) if draw(st.booleans()) else (q, p)


@st.composite
def special_pairs(draw, n: int, *, near_equal: bool = False):
    """Structured edge cases: p == q, point masses, disjoint supports, uniform (and near-equal pairs)."""
    kinds = ["equal", "point", "disjoint", "uniform", "point-vs-any"] + (["near-equal"] if near_equal else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "equal":
        p = draw(distributions(n))
        return p, p.copy()
    if kind == "near-equal":
        return draw(_near_equal(n))
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
def pairs(draw, min_n: int = 1, max_n: int = 5, *, near_equal: bool = False, target_zero: bool = False):
    """A (p, q) pair on a common vocabulary of size in [min_n, max_n].

    One draw in four is a :func:`special_pairs` case; ``near_equal=True`` adds
    pairs equal up to a relative perturbation to those cases.
    ``target_zero=True`` makes the target support-limited: ``q`` has at least
    one exact zero (``min_n`` must then be at least 2), the case where a
    boundary-coin phase can fail (a target without zeros makes it vacuous).
    """
    if target_zero and min_n < 2:
        raise ValueError(f"`min_n` must be at least 2 with target_zero=True, got {min_n}")
    n = draw(st.integers(min_n, max_n))
    if draw(st.integers(0, 3)) == 0:
        p, q = draw(special_pairs(n, near_equal=near_equal))
    else:
        p, q = draw(distributions(n)), draw(distributions(n))
    if target_zero and np.all(q > 0):
        q = q.copy()
        q[draw(st.integers(0, n - 1))] = 0.0  # n >= 2 positive entries: mass is left
        q = _normalise(q)
    return p, q


@dataclass(frozen=True, eq=False)
class SamplingLaw:
    """Logits, the sampling parameters, and the processed law they define.

    Attributes
    ----------
    logits : (V,) ndarray of float64
        Finite logits or ``-inf``.
    temperature : float
    top_k : int or None
    top_p : float or None
    law : (V,) ndarray of float64
        :func:`otspec.testing.processed_law` of the above.
    """

    logits: np.ndarray
    temperature: float
    top_k: int | None
    top_p: float | None
    law: np.ndarray


@st.composite
def sampling_laws(draw, min_n: int = 2, max_n: int = 8, *, separated: bool = False):
    """Logits with sampling parameters (temperature, top-k, top-p) and their processed law.

    Adversarial by default: tied logits (also at the top-k boundary), ``-inf``
    entries, extreme logits and ``top_p`` exactly at a cumulative mass.
    ``separated=True`` keeps every boundary decision at least 1e-3 away from
    a tie (distinct logits 0.25 apart, ``top_p`` midway between two cumulative
    masses), for comparisons with engines that compute in float32.
    """
    n = draw(st.integers(min_n, max_n))
    if separated:
        ints = draw(st.lists(st.integers(-40, 40), min_size=n, max_size=n, unique=True))
        logits = np.array(ints, dtype=np.float64) / 4.0
    else:
        elem = st.one_of(
            st.floats(min_value=-30.0, max_value=30.0),
            st.sampled_from([0.0, 1.0, -1.0]),  # ties
            st.just(-np.inf),
        )
        logits = np.array(draw(st.lists(elem, min_size=n, max_size=n)), dtype=np.float64)
        if not np.isfinite(logits).any():
            logits[draw(st.integers(0, n - 1))] = 0.0
    temperature = draw(st.one_of(st.just(1.0), st.just(0.7), st.floats(min_value=0.25, max_value=2.0)))
    top_k = draw(st.one_of(st.none(), st.integers(1, n)))
    top_p = None
    if draw(st.booleans()):
        base = processed_law(logits, temperature=temperature, top_k=top_k)
        cums = np.cumsum(np.sort(base[base > 0])[::-1])
        if separated:
            before = np.concatenate(([0.0], cums[:-1]))
            mids = ((before + cums) / 2)[cums - before >= 2e-3]  # away from every cumulative mass
            top_p = float(draw(st.sampled_from(mids.tolist())))
        else:
            top_p = float(draw(st.one_of(st.floats(min_value=0.05, max_value=1.0),
                                         st.sampled_from(np.clip(cums, 1e-9, 1.0).tolist()))))
    law = processed_law(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    logits.setflags(write=False)
    return SamplingLaw(logits, float(temperature), top_k, top_p, law)
