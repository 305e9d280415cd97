"""The profile's per-position quantities, batched: against independent per-row routes, and numpy against torch.

Every batched quantity of a draft tree (alpha_k shared by "optimal" and "lp", the maximal coupling, k-Seq's
acceptance for every k from one sort, token and block verification's E[tau | X] for every row and length at
once) is compared with an independent route computed row by row: otspec.alpha_k on 1-D laws, sum(min(p, q)),
batched_kseq_acceptance for one k at a time, products of min(1, q/p) in plain Python, and
otspec.block.tau_law_on_path per row and length. The renewal tables computed once per scheme equal
emission_probs_along per (k, L) bit for bit. The laws as torch CPU tensors (the array-API path of a GPU run)
give every recorded number of the numpy path to 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest

import otspec
from otspec.block import tau_law_on_path
from otspec.multidraft import batched_kseq_acceptance
from otspec.multidraft._batched import kseq_acceptance_rows
from otspec.profile import ProfileSettings
from otspec.profile._collect import _Rows, position_rows
from otspec.profile._quantities import (
    Builds,
    block_path_laws,
    block_path_laws_stack,
    depth_quantities,
    expected_accepted,
)
from otspec.profile._renewal import emission_probs_along, emission_tables


def _laws(rng, V: int, top: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A draft law and a target law close to it (ratios q/p on both sides of 1), optionally top-k truncated."""
    out = []
    z = rng.standard_normal(V) * 2.5
    for logits in (z, z + 0.8 * rng.standard_normal(V)):
        if top is not None:  # top-k truncation: zero mass outside the top tokens
            logits = np.where(logits >= np.sort(logits)[-top], logits, -np.inf)
        w = np.exp(logits - logits.max())
        out.append(w / w.sum())
    return out[0], out[1]


def _tree(seed: int, V: int, k: int, L: int, top: int | None = None, laws_of=None):
    """A draft tree whose laws depend on the prefix only (as a model's do), with rows sharing prefixes; each prefix's
    ``(p, q)`` from ``laws_of(rng)`` (default :func:`_laws`)."""
    rng = np.random.default_rng(seed)
    laws_of = laws_of or (lambda g: _laws(g, V, top))
    X = np.zeros((k, L), dtype=np.int64)
    P, Q = np.empty((k, L, V)), np.empty((k, L + 1, V))
    laws: dict = {}
    for r in range(k):
        for j in range(L + 1):
            key = tuple(X[r, :j].tolist())
            if key not in laws:
                laws[key] = laws_of(rng)
            Q[r, j] = laws[key][1]
            if j < L:
                P[r, j] = laws[key][0]
                share = r % 2 == 1 and (X[r, :j] == X[r - 1, :j]).all() and rng.random() < 0.7
                X[r, j] = X[r - 1, j] if share else rng.choice(V, p=P[r, j])
    return X, P, Q


@pytest.mark.parametrize("top", [None, 12])
def test_batched_depth_quantities_equal_per_row_routes(top):
    X, P, Q = _tree(1, 300, 3, 3, top)
    ks = (1, 2, 3)
    b = Builds(X, P, Q, {})
    opt, lp = depth_quantities("optimal", ks, b, 3), depth_quantities("lp", ks, b, 3)
    ks_acc = depth_quantities("kseq", ks, b, 3)
    tok = depth_quantities("token", (1,), b, 3)
    for j in range(3):
        want = otspec.alpha_k(P[0, j], Q[0, j], list(ks))
        for i, k in enumerate(ks):
            np.testing.assert_allclose(opt[("acc", k)][j], want[i], rtol=1e-12, atol=0)
            assert lp[("acc", k)][j] == opt[("acc", k)][j]
            one = float(batched_kseq_acceptance(b.P[0, j : j + 1], b.Q[0, j : j + 1], k)[0])  # the laws on S
            assert ks_acc[("acc", k)][j] == one  # one sort for every k: the same value as k alone, bit for bit
            rho = otspec.kseq_rho_star(P[0, j], Q[0, j], k)
            np.testing.assert_allclose(one, otspec.kseq_p_acc(P[0, j], Q[0, j], k, rho), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(tok[("acc", 1)][j], np.minimum(P[0, j], Q[0, j]).sum(), rtol=1e-12, atol=0)


def test_kseq_rows_share_one_sort_bit_for_bit():
    rng = np.random.default_rng(2)
    P, Q = rng.dirichlet(np.full(500, 0.3), size=(2, 3)), rng.dirichlet(np.full(500, 0.3), size=(2, 3))
    import array_api_compat

    got = kseq_acceptance_rows(P, Q, [3, 1, 2, 5], array_api_compat.array_namespace(P))
    for k, g in zip([3, 1, 2, 5], got):
        np.testing.assert_array_equal(g, batched_kseq_acceptance(P, Q, k))


@pytest.mark.parametrize("top", [None, 12])
def test_token_and_block_expected_tokens_equal_per_row_routes(top):
    k_max, L = 4, 3
    X, P, Q = _tree(3, 200, k_max, L, top)
    b = Builds(X, P, Q, {})
    # token: E[tau_L | X] = sum_{j <= L} prod_{i <= j} min(1, q_i(x_i) / p_i(x_i)), averaged over the G groups
    for k in (1, 2, 4):
        G = k_max // k
        want = np.zeros(L)
        for g in range(G):
            r, prod = g * k, 1.0
            for j in range(L):
                prod *= min(1.0, float(Q[r, j, X[r, j]]) / float(P[r, j, X[r, j]]))
                want[j:] += prod / G
        np.testing.assert_allclose(expected_accepted("token", k, b, L)["tau"], want, rtol=1e-12, atol=0)
    # block schemes: the law of tau along each row from otspec.block.tau_law_on_path, one length at a time
    for name in ("block", "block-onestep"):
        got = expected_accepted(name, 1, b, L)
        tau, calls = np.zeros(L), np.zeros(L)
        for r in range(k_max):
            for ell in range(1, L + 1):
                law = tau_law_on_path(name, X[r, :ell], list(P[r, :ell]), list(Q[r, :ell]))
                tau[ell - 1] += law @ np.arange(ell + 1) / k_max
                calls[ell - 1] += (1.0 + law[:ell] @ (ell - np.arange(ell))) / k_max
        np.testing.assert_allclose(got["tau"], tau, rtol=1e-12, atol=0)
        if name == "block":
            np.testing.assert_allclose(got["calls"], calls, rtol=1e-12, atol=0)


def test_block_path_laws_are_laws_and_match_per_path():
    X, P, Q = _tree(4, 50, 3, 4)
    for name in ("block", "block-onestep"):
        law = block_path_laws(name, P, Q, X, 4)
        assert law.shape == (3, 4, 5)
        np.testing.assert_allclose(law.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
        for r in range(3):
            for ell in range(1, 5):
                want = tau_law_on_path(name, X[r, :ell], list(P[r, :ell]), list(Q[r, :ell]))
                np.testing.assert_allclose(law[r, ell - 1, : ell + 1], want, rtol=1e-12, atol=1e-15)
                assert (law[r, ell - 1, ell + 1 :] == 0).all()


def _walked_block_path_laws(name: str, P, Q, X, L: int, total=np.sum) -> np.ndarray:
    """block_path_laws walked as the definition reads, one depth and one step at a time (numpy): the running
    weight, then for each length the backward walk from t = ell - 1 down to 0 (``total``: the sum over the
    vocabulary, numpy's or torch's, whose orders of summation differ)."""
    R = P.shape[0]
    out = np.zeros((R, L, L + 1))
    for r in range(R):
        px = P[r, np.arange(L), X[r, :L]]
        qx = Q[r, np.arange(L), X[r, :L]]
        w = [1.0]
        for i in range(L):
            ratio = qx[i] / px[i] if px[i] > 0 else 1.0
            w.append(min(w[-1] * ratio, 1.0) if name == "block-onestep" else w[-1] * ratio)
        a = [1.0]
        for t in range(1, L):
            d = w[t] * Q[r, t] - P[r, t]
            pos = float(total(np.clip(d, 0.0, None)))
            if name == "block-onestep":
                den = pos + (1.0 - w[t])
                a.append(pos / den if den > 0 else 1.0)
            else:
                neg = float(total(np.clip(-d, 0.0, None)))
                a.append(min(pos / neg, 1.0) if neg > 0 else 1.0)
        for ell in range(1, L + 1):
            top = w[ell] if name == "block-onestep" else min(w[ell], 1.0)
            out[r, ell - 1, ell] = top
            left = 1.0 - top
            for t in range(ell - 1, -1, -1):
                out[r, ell - 1, t] = left * a[t]
                left = left * (1.0 - a[t])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_block_path_laws_stack_equal_the_walk_along_the_depths(seed):
    """The batched closed forms (a cumulative product per length, the one-step weights as the least capped suffix
    product) give the values of the walk along the depths bit for bit, on numpy and torch's CPU, for ratios far
    past 1 (weights capped, suffix products overflowing) and p = 0 or q = 0 at the drafted tokens."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    R, L, V = 3, 5, 7
    P = rng.dirichlet(np.full(V, 0.3), size=(R, L))
    Q = rng.dirichlet(np.full(V, 0.3), size=(R, L + 1))
    X = rng.integers(0, V, size=(R, L))
    if seed % 2:
        P[0, :, X[0, 0]] = 1e-160  # ratios about 1e160: their products overflow
        X[0] = X[0, 0]
        P[1][P[1] < 0.1] = 0.0  # p = 0 or q = 0 at some drafted tokens
        Q[1][Q[1] < 0.1] = 0.0
    copies = P.copy(), Q.copy(), X.copy()
    names = ["block", "block-onestep"]
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.stack([_walked_block_path_laws(n, P, Q, X, L) for n in names])
    got = block_path_laws_stack(names, P, Q, X, L)
    np.testing.assert_array_equal(got, want)
    with np.errstate(over="ignore", invalid="ignore"):
        want_t = np.stack([_walked_block_path_laws(n, P, Q, X, L, lambda d: torch.from_numpy(d).sum().item())
                           for n in names])
    got_t = block_path_laws_stack(names, torch.from_numpy(P), torch.from_numpy(Q), torch.from_numpy(X), L)
    np.testing.assert_array_equal(got_t.numpy(), want_t)
    for f, n in enumerate(names):
        with np.errstate(over="ignore", invalid="ignore"):  # block's own weight overflows, as it did walked
            np.testing.assert_array_equal(block_path_laws(n, P, Q, X, L), want[f])
    for a, b in zip(copies, (P, Q, X)):
        np.testing.assert_array_equal(a, b)


def test_block_path_laws_stack_refuses_other_names():
    X, P, Q = _tree(4, 20, 2, 2)
    with pytest.raises(ValueError, match="`names`"):
        block_path_laws_stack(["token"], P, Q, X, 2)


@pytest.mark.parametrize("scheme,ks", [("token", (1,)), ("block-onestep", (1,)), ("kseq", (1, 2, 3)),
                                       ("multiround", (1, 2, 3)), ("optimal", (1, 2))])
def test_emission_tables_equal_emission_probs_along(scheme, ks):
    rng = np.random.default_rng(7)
    T, V = 7, 30
    p, q = rng.dirichlet(np.full(V, 0.5), size=T), rng.dirichlet(np.full(V, 0.5), size=T)
    y = np.array([rng.choice(V, p=row) for row in q])
    tables = emission_tables(scheme, p, q, y, ks=ks, Ls=(1, 2, 3))
    assert set(tables) == {(k, L) for k in ks for L in (1, 2, 3)}
    for (k, L), e in tables.items():
        np.testing.assert_array_equal(e, emission_probs_along(scheme, p, q, y, L=L, k=k))


def test_emission_tables_refuse_what_emission_probs_refuses():
    p = q = np.full((3, 2), 0.5)
    y = np.array([0, 1, 0])
    with pytest.raises(ValueError, match="closed form"):
        emission_tables("lp", p, q, y, ks=(2,), Ls=(1,))
    with pytest.raises(ValueError, match="`k` must be 1"):
        emission_tables("token", p, q, y, ks=(2,), Ls=(1,))


def _rows(X, P, Q, settings):
    rows = _Rows(0)
    position_rows(rows, 0, X, P, Q, settings, costly=True)
    c = rows.cols
    return {(c["kind"][i], c["name"][i], c["k"][i], c["j"][i]): c["value"][i] for i in range(len(c["value"]))}


@pytest.mark.parametrize("top", [None, 40])
def test_torch_cpu_laws_give_the_numpy_numbers(top):
    torch = pytest.importorskip("torch")
    X, P, Q = _tree(5, 1000, 3, 3, top)
    s = ProfileSettings(k_max=3, L_max=3, verifiers=["token", "optimal", "lp", "kseq", "multiround"],
                        families=["token", "kseq", "block", "block-onestep"], subsample=1).for_vocabulary(1000)
    want = _rows(X, P, Q, s)
    got = _rows(X, torch.from_numpy(P), torch.from_numpy(Q), s)
    assert set(got) == set(want) and len(want) > 40
    keys = sorted(want)
    np.testing.assert_allclose([got[key] for key in keys], [want[key] for key in keys], rtol=1e-12, atol=0)
    for name in ("block", "block-onestep"):
        law = block_path_laws(name, torch.from_numpy(P), torch.from_numpy(Q), torch.from_numpy(X), 3)
        assert isinstance(law, torch.Tensor) and law.dtype == torch.float64
        np.testing.assert_allclose(law.numpy(), block_path_laws(name, P, Q, X, 3), rtol=1e-12, atol=1e-16)


def test_builds_keep_the_callers_arrays_unchanged():
    X, P, Q = _tree(6, 60, 2, 2, 8)
    copies = X.copy(), P.copy(), Q.copy()
    s = ProfileSettings(k_max=2, L_max=2, subsample=1).for_vocabulary(60)
    _rows(X, P, Q, s)
    for a, c in zip((X, P, Q), copies):
        np.testing.assert_array_equal(a, c)
