"""The profile's k-Seq acceptance at ``k = 1`` keeps its relative accuracy however small it is.

At ``k = 1`` k-Seq (Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport", arXiv:2310.15141, §4) is
the maximal coupling: :math:`\\rho^* = 1` and its acceptance is :math:`\\sum_x \\min(p(x), q(x))` (Leviathan et al.,
arXiv:2211.17192, §3.5). The profile formed that column as ``1 - E`` with :math:`E = \\sum_x (p(x) - q(x))_+`, which
cancels when the acceptance ``a`` is small (a relative error of about ``1e-16 / a``: 0 for a true ``1e-300``); below
1/2 the column is now the sum of the minimum itself (as :func:`otspec.multidraft.batched_kseq_acceptance` forms it),
and at the subsampled positions of the device route token verification's acceptance is handed from that same sum.

Checked here on every route that computes the column (the position's one pass, :func:`prefill_batched`, with
k-Seq costly or cheap, and the per-prompt :func:`depth_quantities`; numpy and torch on the CPU): against
:func:`math.fsum` of the minimum (the exactly rounded sum of the floats' minima, an independent route), to a
relative 1e-12, on laws whose acceptance hypothesis draws anywhere from about 1/2 down to 1e-300; and bit for bit
against the library's :func:`~otspec.multidraft.batched_kseq_acceptance` at ``k = 1`` and token verification's
acceptance. Hypothesis runs derandomized: no test here fails by chance.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import otspec.profile._quantities as PQ  # noqa: E402
from otspec.multidraft import batched_kseq_acceptance, batched_maximal_coupling_acceptance  # noqa: E402

L = 2
#: The relative error allowed against the exactly rounded sum: a float sum of ``V <= 8`` non-negative terms is
#: within ``(V - 1) eps`` of it; the ``1 - E`` form is off by about ``1e-16 / a`` (1e-6 at ``a = 1e-10``).
REL = 1e-12


@st.composite
def overlap_laws(draw):
    """``(X, P, Q)`` of one position (``k_max = 3`` blocks of ``L`` depths, ``V <= 8`` tokens): at each depth ``p`` on
    the first ``s`` tokens and ``q`` on the others but a mass ``10**e`` spread over the first ``s`` (an acceptance of
    about ``10**e``, ``e`` drawn per depth in [-300, 0]: from about ``min(1/2, ...)`` down to 1e-300), the weights
    from a seeded generator."""
    V = draw(st.integers(3, 8))
    s = draw(st.integers(1, V - 1))
    e = draw(st.lists(st.floats(-300.0, 0.0), min_size=L + 1, max_size=L + 1))
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k_max = 3
    P = np.zeros((k_max, L, V))
    Q = np.zeros((k_max, L + 1, V))
    for j in range(L + 1):
        eps = 10.0 ** e[j]
        if j < L:
            P[:, j, :s] = r.dirichlet(np.ones(s))
        Q[:, j, s:] = r.dirichlet(np.ones(V - s)) * (1.0 - eps)
        Q[:, j, :s] = r.dirichlet(np.ones(s)) * eps
    X = np.zeros((k_max, L), dtype=np.int64)
    return X, P, Q


def exact(p: np.ndarray, q: np.ndarray) -> float:
    """sum min(p, q), exactly rounded (:func:`math.fsum` of the minima: each a float itself)."""
    return math.fsum(np.minimum(p, q).tolist())


def prefill(X, P, Q, lib: str, ks: tuple, cheap: bool, token: bool = True):
    """The position's one pass (:func:`prefill_batched`): k-Seq's acceptance ``(L, len(ks))`` and, with ``token``,
    token verification's ``(L,)``; k-Seq costly (the default settings: computed at subsampled positions) or cheap."""
    if lib == "torch":
        P, Q = torch.from_numpy(P), torch.from_numpy(Q)
    b = PQ.Builds(X, P, Q, {})
    verifiers = (("token",) if token else ()) + (("kseq",) if cheap else ())
    PQ.prefill_batched([b], verifiers, (), lambda name: ks, L, subsampled=[True],
                       costly=((() if cheap else ("kseq",)), ()))
    return np.asarray(b._batched[("kseq", ks, L)]), (np.asarray(b._batched[("token-acc", L)]) if token else None)


def per_prompt(X, P, Q, lib: str, ks: tuple) -> np.ndarray:
    """The per-prompt route (:func:`depth_quantities`): k-Seq's acceptance ``(L, len(ks))``."""
    if lib == "torch":
        P, Q = torch.from_numpy(P), torch.from_numpy(Q)
    got = PQ.depth_quantities("kseq", ks, PQ.Builds(X, P, Q, {}), L)
    return np.stack([np.asarray(got[("acc", k)]) for k in ks], axis=-1)


def _check(acc: np.ndarray, P, Q, where: str) -> None:
    for j in range(L):
        want = exact(P[0, j], Q[0, j])
        assert want > 0.0
        assert abs(acc[j] - want) <= REL * want, (where, j, float(acc[j]), want)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(overlap_laws(), st.sampled_from([(1,), (1, 2), (1, 2, 3)]))
def test_k1_column_is_the_exact_sum_of_the_minimum(laws, ks):
    # fails on the 1 - E form (the code before): at an acceptance of 1e-10 its relative error is about 1e-6, and
    # below 1e-16 it gives 0
    X, P, Q = laws
    c = ks.index(1)
    for lib in ("numpy", "torch"):
        for cheap in (False, True):
            acc, tok = prefill(X, P, Q, lib, ks, cheap)
            _check(acc[:, c], P, Q, (lib, "prefill", "cheap" if cheap else "costly"))
            _check(tok, P, Q, (lib, "prefill token"))
        _check(per_prompt(X, P, Q, lib, ks)[:, c], P, Q, (lib, "per prompt"))


@settings(max_examples=10, deadline=None, derandomize=True)
@given(overlap_laws())
def test_k1_column_is_the_library_s_and_token_s_bit_for_bit(laws):
    # the column is batched_kseq_acceptance(p, q, 1) (1 - E at and above 1/2, sum min below) to the bit on every
    # route, and the token acceptance handed from k-Seq's part is the one its own part gives: a sum of the minimum
    # formed on other rows or another layout, or 1 - E kept below 1/2, or sum min taken at and above 1/2, fails
    X, P, Q = laws
    ks = (1, 2)
    for lib in ("numpy", "torch"):
        arr = torch.from_numpy if lib == "torch" else np.asarray
        want = np.asarray(batched_kseq_acceptance(arr(P[0, :L]), arr(Q[0, :L]), 1))
        tok_want = np.asarray(batched_maximal_coupling_acceptance(arr(P[0, :L]), arr(Q[0, :L])))
        for cheap in (False, True):
            acc, tok = prefill(X, P, Q, lib, ks, cheap)
            np.testing.assert_array_equal(acc[:, 0], want)
            np.testing.assert_array_equal(tok, tok_want)
            alone, _ = prefill(X, P, Q, lib, ks, cheap, token=False)  # k-Seq without token verification
            np.testing.assert_array_equal(alone, acc)
        np.testing.assert_array_equal(per_prompt(X, P, Q, lib, ks)[:, 0], want)


def test_laws_above_and_below_one_half():
    # the two sides of the switch on fixed laws: a = 0.7 (1 - E, no cancellation) and a = 0.3, 1e-10, 1e-300 (sum min)
    for a in (0.7, 0.3, 1e-10, 1e-300):
        P = np.zeros((3, L, 4))
        Q = np.zeros((3, L + 1, 4))
        P[:, :, :2] = [0.5, 0.5]
        Q[:, :, :2] = [a / 2, a / 2]
        Q[:, :, 2:] = [(1 - a) / 2, (1 - a) / 2]
        X = np.zeros((3, L), dtype=np.int64)
        for lib in ("numpy", "torch"):
            acc, tok = prefill(X, P, Q, lib, (1, 2), cheap=False)
            _check(acc[:, 0], P, Q, (lib, a))
            _check(tok, P, Q, (lib, a, "token"))
            arr = torch.from_numpy if lib == "torch" else np.asarray
            np.testing.assert_array_equal(acc[:, 0], np.asarray(batched_kseq_acceptance(arr(P[0]), arr(Q[0, :L]), 1)))
