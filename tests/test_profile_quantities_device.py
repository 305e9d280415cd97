"""The profile's costly per-position quantities in batched closed forms, against the host verifier objects.

Every batched form of :mod:`otspec.profile._quantities_batched` (per-depth acceptance of multi-round sampling, of
greedy and top-k draft sets and of typical acceptance with its output law's total variation and KL; the conditional
laws of k-Seq, multi-round sampling and typical acceptance at every node of a draft tree, hence E[tau_L | X]) is
compared with the independent route: the host verifiers of ``otspec.multidraft`` and ``otspec.lossy`` built per depth
and per node on the union support (their ``acceptance()``, ``output_law()`` and ``conditional()``), as the profile
computed these quantities before. The laws come as numpy arrays and as torch CPU tensors (the array-API route of a
GPU run), with ties, zeros, one-hot rows and several vocabularies, and from hypothesis; every value agrees to 1e-12
relative (the largest difference seen is a few 1e-16).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec._registry import get_verifier
from otspec.lossy._mentored import kl_divergence
from otspec.multidraft._greedy_drafts import top_tokens
from otspec.profile import ProfileSettings
from otspec.profile._collect import _Rows, position_rows
from otspec.profile._quantities import Builds, _lossy_gaps, depth_quantities, expected_accepted, tree_reach
from otspec.profile._quantities_batched import acceptance_rows, kl_rows, top_ids
from tests.test_profile_quantities_backend import _tree as _backend_tree

torch = pytest.importorskip("torch")

STYLES = ("smooth", "ties", "onehot", "top")
ACC = ("multiround", "greedy-drafts", "top-k", "typical")
REACH = ("kseq", "multiround", "typical")
RTOL = 1e-12


def _law(rng, V: int, style: str) -> np.ndarray:
    """A law on ``V`` tokens: softmax of Gaussian logits, small integer weights (ties and zeros), a one-hot row
    (half the time, else ties), or a top-5 truncation."""
    if style == "onehot" and rng.random() < 0.5:
        w = np.zeros(V)
        w[rng.integers(V)] = 1.0
    elif style in ("ties", "onehot"):
        w = rng.integers(0, 4, V).astype(float)
        w[rng.integers(V)] += 1.0  # never all zero
    else:
        z = rng.standard_normal(V) * 2.0
        if style == "top":
            z = np.where(z >= np.sort(z)[-min(5, V)], z, -np.inf)
        w = np.exp(z - z.max())
    return w / w.sum()


def _rows(seed: int, n: int, V: int, style: str):
    rng = np.random.default_rng(seed)
    return np.stack([_law(rng, V, style) for _ in range(n)]), np.stack([_law(rng, V, style) for _ in range(n)])


def _tree(seed: int, V: int, k: int, L: int, style: str):
    """A draft tree whose laws (of ``style``) depend on the prefix only, rows sharing prefixes."""
    return _backend_tree(seed, V, k, L, laws_of=lambda rng: (_law(rng, V, style), _law(rng, V, style)))


def _host_acc(name: str, p, q, k: int) -> tuple[float, float, float]:
    """The host verifier's acceptance (and TV, KL of its output law) on the union support, renormalised; NaN where
    the draft set is undefined."""
    keep = (p > 0) | (q > 0)
    pc, qc = p[keep] / p[keep].sum(), q[keep] / q[keep].sum()
    if get_verifier(name).draft_process != "iid" and np.count_nonzero(pc > 0) < k:
        return (np.nan,) * 3
    v = get_verifier(name).build(pc, qc, k)
    tv, kl = _lossy_gaps(v, qc) if name == "typical" else (np.nan, np.nan)
    return float(v.acceptance()), tv, kl


def _close(got, want) -> float:
    """Assert ``got == want`` to RTOL (NaN and inf where the other is); the largest relative difference."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=RTOL, atol=0)
    return float(np.max(np.abs(got[ok] - want[ok]) / np.maximum(np.abs(want[ok]), 1e-300), initial=0.0))


def _check_acceptance(P, Q, lib: str) -> None:
    ks = (1, 2, 3, 4)
    A, B = (P, Q) if lib == "numpy" else (torch.from_numpy(P), torch.from_numpy(Q))
    xp = np if lib == "numpy" else _xp(A)
    for name in ACC:
        kk = (1,) if name == "typical" else ks
        got = acceptance_rows(name, A, B, kk, xp)
        assert type(got) is type(A) and tuple(got.shape) == (P.shape[0], 3 if name == "typical" else len(kk))
        got = np.asarray(got)
        for r in range(P.shape[0]):
            for i, k in enumerate(kk):
                want = _host_acc(name, P[r], Q[r], k)
                if name == "typical":
                    _close(got[r], want)
                else:
                    _close(got[r, i], want[0])


def _xp(a):
    import array_api_compat

    return array_api_compat.array_namespace(a)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("V", [2, 7, 300])
@pytest.mark.parametrize("style", STYLES)
def test_per_depth_acceptance_equals_the_host_verifiers(style, V, lib):
    P, Q = _rows(V + len(style), 6, V, style)
    _check_acceptance(P, Q, lib)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 9), st.sampled_from(STYLES))
def test_per_depth_acceptance_on_generated_laws(seed, V, style):
    P, Q = _rows(seed, 3, V, style)
    _check_acceptance(P, Q, "torch")
    _check_acceptance(P, Q, "numpy")


def test_acceptance_rows_keep_leading_axes_and_the_laws_unchanged():
    P, Q = _rows(3, 6, 11, "ties")
    P, Q = P.reshape(2, 3, 11), Q.reshape(2, 3, 11)
    copies = P.copy(), Q.copy()
    flat = acceptance_rows("multiround", P.reshape(6, 11), Q.reshape(6, 11), (1, 3), np)
    np.testing.assert_array_equal(acceptance_rows("multiround", P, Q, (1, 3), np), flat.reshape(2, 3, 2))
    np.testing.assert_array_equal(P, copies[0])
    np.testing.assert_array_equal(Q, copies[1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=6, max_size=6), min_size=1, max_size=4), st.integers(1, 6))
def test_top_ids_on_the_device_follow_the_host_s_order_with_ties(weights, K):
    # ties (small integer weights) and zeros: torch's top-K route gives the host's order (most likely first, ties
    # by the lower id), the zero-mass tokens last in id order too
    P = np.array(weights, dtype=float)
    want = np.stack([top_tokens(row, K) for row in P])
    np.testing.assert_array_equal(top_ids(torch.from_numpy(P), K, _xp(torch.from_numpy(P))).numpy(), want)
    np.testing.assert_array_equal(top_ids(P, K, np), want)


def test_kl_rows_equal_kl_divergence():
    rng = np.random.default_rng(4)
    q = rng.dirichlet(np.ones(8), size=5)
    pi = q * (1 + 1e-3 * rng.standard_normal((5, 8)))  # close: the series branch
    pi /= pi.sum(axis=1, keepdims=True)
    pi[1] = rng.dirichlet(np.ones(8))  # far
    pi[2, 3] = 0.0  # misses mass of q: inf
    pi[2] /= pi[2].sum()  # still a law (kl_divergence refuses one that is not)
    q[3, :2] = 0.0  # q = 0 where pi > 0
    q[3] /= q[3].sum()
    for lib in (np, _xp(torch.zeros(1))):
        a, b = (q, pi) if lib is np else (torch.from_numpy(q), torch.from_numpy(pi))
        got = np.asarray(kl_rows(a, b, lib))
        _close(got, [kl_divergence(q[i], pi[i]) for i in range(5)])


def _host_tau(name: str, k: int, X, P, Q, L: int) -> np.ndarray:
    """E[tau_L | X] of ``name`` by the host verifiers' ``conditional()`` at every node (:func:`tree_reach`)."""
    h = Builds(X, P, Q, {})
    G = X.shape[0] // k
    reach = np.zeros(L)
    for g in range(G):
        reach += tree_reach(name, list(range(g * k, (g + 1) * k)), h, L) / G
    return np.cumsum(reach)


def _check_reach(X, P, Q, lib: str) -> float:
    k_max, L = X.shape[0], X.shape[1]
    A, B = (P, Q) if lib == "numpy" else (torch.from_numpy(P), torch.from_numpy(Q))
    b = Builds(X, A, B, {})
    worst = 0.0
    for name in REACH:
        for k in (1,) if name == "typical" else range(1, k_max + 1):
            worst = max(worst, _close(expected_accepted(name, k, b, L)["tau"], _host_tau(name, k, X, P, Q, L)))
    if lib == "torch":
        assert b._host is None  # no host copy of the laws for these
    return worst


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("V", [3, 40, 500])
@pytest.mark.parametrize("style", STYLES)
def test_expected_accepted_equals_the_host_verifiers_conditional_laws(style, V, lib):
    X, P, Q = _tree(V + 7 * len(style), V, 4, 3, style)
    assert _check_reach(X, P, Q, lib) < RTOL


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 8), st.sampled_from(STYLES), st.integers(2, 5))
def test_expected_accepted_on_generated_trees(seed, V, style, k_max):
    X, P, Q = _tree(seed, V, k_max, 3, style)
    _check_reach(X, P, Q, "torch")
    _check_reach(X, P, Q, "numpy")


def test_typical_options_reach_the_batched_forms():
    X, P, Q = _tree(11, 30, 2, 3, "smooth")
    opts = {"typical": {"epsilon": 0.3, "delta": 0.9}}
    b = Builds(X, torch.from_numpy(P), torch.from_numpy(Q), opts)
    got = depth_quantities("typical", (1,), b, 3, lossless=False)
    h = Builds(X, P, Q, opts)
    for j in range(3):
        _, pc, qc = h.support(0, j)
        v = get_verifier("typical").build(pc, qc, 1, **opts["typical"])
        _close([got[("acc", 1)][j], got[("tv", 1)][j], got[("kl", 1)][j]], (v.acceptance(), *_lossy_gaps(v, qc)))
    tau = expected_accepted("typical", 1, b, 3)["tau"]
    reach = sum(tree_reach("typical", [r], h, 3) for r in range(2)) / 2
    _close(tau, np.cumsum(reach))


def _position(X, P, Q, s, batched: bool, monkeypatch) -> dict:
    import otspec.profile._quantities as M

    with monkeypatch.context() as m:
        if not batched:  # the host route of before: every costly quantity built per depth / node
            m.setattr(M, "acc_part", lambda name, ks, builds, L: None if name != "kseq" else ORIG_ACC(
                name, ks, builds, L))
            m.setattr(M, "reach_part", lambda *a: None)
        rows = _Rows(0)
        position_rows(rows, 0, X, P, Q, s, costly=True)
    c = rows.cols
    return {(c["kind"][i], c["name"][i], c["k"][i], c["j"][i]): c["value"][i] for i in range(len(c["value"]))}


def _orig_acc():
    from otspec.profile._quantities import acc_part

    return acc_part


ORIG_ACC = _orig_acc()


@pytest.mark.parametrize("style", ["smooth", "ties", "onehot"])
def test_position_rows_are_the_host_route_s(style, monkeypatch):
    # every row a subsampled position writes with the default verifiers and families (all costly ones on), the laws
    # as numpy arrays and as torch tensors, against the host route of before
    X, P, Q = _tree(21, 60, 4, 3, style)
    s = ProfileSettings(k_max=4, L_max=3, subsample=1).for_vocabulary(60)
    want = _position(X, P, Q, s, False, monkeypatch)
    assert {"multiround", "greedy-drafts", "top-k", "typical", "kseq"} <= {key[1] for key in want}
    for A, B in ((P, Q), (torch.from_numpy(P), torch.from_numpy(Q))):
        got = _position(X, A, B, s, True, monkeypatch)
        assert set(got) == set(want)
        keys = sorted(want)
        _close([got[key] for key in keys], [want[key] for key in keys])


def test_a_subsampled_position_reads_the_host_as_often_as_a_cheap_one(monkeypatch):
    # the device route: every batched costly quantity of a subsampled position comes back in one read (no host copy
    # of the laws, no read per verifier); the costly quantities' batched forms lay their tree out on the host from the
    # drafts, read in the position's one read with the path's law and the flags (as at a cheap position), so their
    # values come in the next position's read, the last position's at the walk's end: one read more per walk (before:
    # one more per subsampled position, the drafts read on their own)
    pytest.importorskip("transformers")
    import otspec.profile._collect as C
    from otspec.profile._collect import profile_prompt
    from tests.test_profile_host_reads import HostReads
    from tests.toy_lm import tiny_llama

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    reads = {}
    for sub in (0, 1):
        s = ProfileSettings(k_max=3, L_max=2, max_new_tokens=2, subsample=sub,
                            verifiers=["token", "optimal", "kseq", *ACC],
                            families=["token", "block", *REACH]).for_vocabulary(40)
        with HostReads() as mode:
            rows = profile_prompt(draft, target, [3, 7, 1], None, s, 0)
        assert ("typical" in rows["name"]) == (sub > 0)
        reads[sub] = len(mode.reads)
    assert reads[1] == reads[0] + 1, reads  # the last subsampled position's values, read at the walk's end


def test_the_batched_forms_make_no_scalar_tensors_and_one_copy_of_indices():
    # on a GPU a Python number made into a device tensor (array-api-compat's maximum(x, 0.0) does so) and a host array
    # copied to the device each wait for the device's queue: the batched forms clip with numbers instead, and the
    # conditional laws at the nodes take the tree's indices to the device in one copy per name
    from torch.overrides import TorchFunctionMode

    from otspec.profile._quantities import _kseq_acceptance
    from otspec.profile._quantities_batched import reach_nodes, reach_parts

    class Made(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("asarray", "as_tensor", "tensor", "scalar_tensor"):
                self.calls.append(func.__name__)
            return func(*args, **(kwargs or {}))

    X, P, Q = _tree(3, 50, 4, 3, "ties")
    Pt, Qt = torch.from_numpy(P), torch.from_numpy(Q)
    xp = _xp(Pt)
    nodes = reach_nodes(X, [[0, 1], [2, 3], [0, 1, 2, 3], [0], [1], [2], [3]], 3)
    for name in REACH:
        with Made() as mode:
            reach_parts(name, Pt, Qt, X, nodes, xp)
        assert mode.calls == ["asarray"], (name, mode.calls)
    with Made() as mode:
        for name in ACC:
            acceptance_rows(name, Pt[0], Qt[0, :3], (1,) if name == "typical" else (1, 2, 3), xp)
        _kseq_acceptance(Pt[0], Qt[0, :3], (1, 2, 3), xp)
    assert not mode.calls, mode.calls
