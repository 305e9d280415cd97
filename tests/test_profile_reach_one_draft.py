"""E[tau | X] of the optimal verifier and Khisti et al.'s rule: their one-draft nodes batched in the laws' namespace.

At a node of the draft tree where one draft ``x`` is alive, every lossless verifier that attains
:math:`\\alpha_1 = \\sum_y \\min(p(y), q(y))` with one draft (the optimal verifier; Khisti et al.'s canonical
decomposition, arXiv:2410.18234) accepts ``x`` with :math:`\\min(1, q(x)/p(x))`: the profile computes those nodes'
values for the whole tree at once where the laws are (numpy, or torch on their device) and builds the verifier on the
host only at the nodes with several drafts. Checked against the independent route of before -- the host verifier
objects built at every node and asked for their exact ``conditional()`` (:func:`otspec.profile._quantities.tree_reach`)
-- on numpy arrays and torch CPU tensors, with ties, zeros, one-hot rows and a top-5 truncation, and from hypothesis.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.profile._quantities import Builds, expected_accepted
from tests.test_profile_quantities_device import STYLES, _close, _host_tau, _tree

torch = pytest.importorskip("torch")


def _both(X, P, Q, name: str, lib: str):
    """``{k: E[tau_L | X]}`` of ``name`` for every ``k`` on the laws of ``lib``, and whether the laws were copied to
    the host."""
    A, B = (P, Q) if lib == "numpy" else (torch.from_numpy(P), torch.from_numpy(Q))
    b = Builds(X, A, B, {})
    L = X.shape[1]
    out = {k: expected_accepted(name, k, b, L)["tau"] for k in range(1, X.shape[0] + 1)}
    return out, b._host is not None


def _check(X, P, Q, name: str, lib: str) -> float:
    got, copied = _both(X, P, Q, name, lib)
    worst = 0.0
    for k, tau in got.items():
        worst = max(worst, _close(tau, _host_tau(name, k, X, P, Q, X.shape[1])))
    tok, _ = _both(X, P, Q, "token", lib)
    np.testing.assert_array_equal(got[1], tok[1])  # k = 1: token verification's value, bit for bit
    if lib == "torch":
        assert copied  # the root's several drafts (k >= 2) are built on the host
    return worst


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("V", [3, 40, 300])
@pytest.mark.parametrize("style", STYLES)
def test_optimal_equals_the_host_verifiers_conditional_laws(style, V, lib):
    X, P, Q = _tree(V + 11 * len(style), V, 4, 3, style)
    assert _check(X, P, Q, "optimal", lib) < 1e-12


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("V", [2, 5])
@pytest.mark.parametrize("style", STYLES)
def test_khisti_equals_the_host_verifiers_conditional_laws(style, V, lib):
    # Khisti's selection LP enumerates draft multisets: small vocabularies
    X, P, Q = _tree(V + 13 * len(style), V, 3, 3, style)
    assert _check(X, P, Q, "khisti", lib) < 1e-12


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 7), st.sampled_from(STYLES), st.integers(2, 4),
       st.sampled_from(["optimal", "khisti"]))
def test_generated_trees(seed, V, style, k_max, name):
    if name == "khisti":
        k_max = min(k_max, 3)
    X, P, Q = _tree(seed, V, k_max, 3, style)
    _check(X, P, Q, name, "torch")
    _check(X, P, Q, name, "numpy")


def test_k_one_needs_no_host_copy_and_no_build(monkeypatch):
    # one drafted block (k_max = 1): every node has one draft, so nothing is built and the laws never reach the host
    import otspec.profile._quantities as M

    X, P, Q = _tree(5, 50, 1, 3, "smooth")
    want = _host_tau("token", 1, X, P, Q, 3)
    for name in ("optimal", "khisti"):
        with monkeypatch.context() as m:
            m.setattr(M.Builds, "get", lambda *a: (_ for _ in ()).throw(AssertionError("a verifier was built")))
            b = Builds(X, torch.from_numpy(P), torch.from_numpy(Q), {})
            tau = M.expected_accepted(name, 1, b, 3)["tau"]
        assert b._host is None
        _close(tau, want)


def test_builds_only_at_the_nodes_with_several_drafts(monkeypatch):
    # the verifier is built once per node with several drafts (by prefix and count), never at a one-draft node
    import otspec.profile._quantities as M

    X, P, Q = _tree(8, 30, 4, 3, "ties")
    built = []
    real = M.Builds.get

    def get(self, name, r, j, n):
        built.append(n)
        return real(self, name, r, j, n)

    monkeypatch.setattr(M.Builds, "get", get)
    b = Builds(X, torch.from_numpy(P), torch.from_numpy(Q), {})
    for k in range(1, 5):
        M.expected_accepted("optimal", k, b, 3)
    assert built and min(built) >= 2


@pytest.mark.parametrize("top", [None, 3, 1])
@pytest.mark.parametrize("V", [5, 60])
def test_the_host_copy_holds_the_support_only_and_drop_null_columns_values(top, V):
    # laws off the host reach it restricted to the tokens with mass (truncated: a few columns; one-hot rows with top
    # = 1), with the values, bit for bit, of the host route's restriction of full copies; nothing restricted at full
    # support
    from otspec.profile._quantities import drop_null_columns, support_to_host
    from tests.test_profile_quantities_backend import _tree as tree

    X, P, Q = tree(V + (top or 0), V, 3, 2, top=top)
    want = drop_null_columns(P, Q, X)
    got = support_to_host(torch.from_numpy(P), torch.from_numpy(Q), X)
    for g, w in zip(got, want):
        assert type(g) is np.ndarray and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    if top is not None and V == 60:  # a few tokens of each row's law: not every column
        assert got[0].shape[-1] < V
    b = Builds(X, torch.from_numpy(P), torch.from_numpy(Q), {})
    for g, w in zip(b.host, want):
        np.testing.assert_array_equal(g, w)


def test_the_host_copy_reads_the_laws_once_restricted():
    # two reads: which columns have mass (V booleans), then both laws' values at those columns in one copy
    from tests.test_profile_host_reads import HostReads
    from tests.test_profile_quantities_backend import _tree as tree

    X, P, Q = tree(1, 500, 4, 3, top=5)
    b = Builds(X, torch.from_numpy(P), torch.from_numpy(Q), {})
    sizes = []

    class Sized(HostReads):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in self.READS:
                sizes.append(args[0].numel())
            return super().__torch_function__(func, types, args, kwargs)

    with Sized() as mode:
        Ph, Qh, _ = b.host
    S = Ph.shape[-1]
    assert len(mode.reads) == 2 and sizes == [500, (Ph.size + Qh.size)] and S < 500 // 2, (sizes, S)
