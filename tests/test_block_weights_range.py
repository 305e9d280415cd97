"""Block verification's path weights past the float range on every route: the shared helpers of
:mod:`otspec.block._weights`, the profile's batched laws (:func:`block_path_laws_stack`, numpy and torch-CPU) and
the decoder's routes (the host routes of ``"block"`` and ``"block-onestep"`` and the accelerator's
:func:`block_walk_t` and :func:`block_onestep_tau_law_t`, run on CPU tensors).

Sun et al. ("Block Verification Accelerates Speculative Decoding", arXiv:2403.10444, Algorithm 3) weigh a block by
:math:`w_k = \\prod_{i \\le k} q_i(X_i) / p_i(X_i)`. With draft probabilities below about ``1e-154`` (or ratios whose
running product over- or underflows on the way to a representable weight) a plain float product gives ``inf``,
``nan`` or ``0`` where the exact value is finite. Every value here is checked against rationals of the same float64
inputs (:class:`fractions.Fraction`): the weights themselves, the law of the accepted length, :math:`E[\\tau]`.

The one chi-square test (:func:`block_walk_t`'s accepted length on a path whose weight overflows on the way) fails
spuriously with probability ALPHA_FAIL = 1e-4 (fixed seed: reproducible).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from otspec.block import tau_law_on_path
from otspec.block._weights import BIG_WEIGHT, _scaled_chains, chains_lost, float_chains, path_weight_rows, path_weights
from otspec.profile._quantities import _block_tau_calls, block_path_laws_stack
from tests.test_properties_cm import _exact_tau_law, block_paths

torch = pytest.importorskip("torch")

EPS = 2.0**-52
TINY = 2.0**-1074  # the least subnormal: a weight rounded to the subnormal range is within it
ALPHA_FAIL = 1e-4

# a draft probability of 1e-200 drafted twice: w_2 = (5e199)^2 overflows, then two ratios of 1e-200 bring
# it back to w_4 = w_5 = 1/4 (plain float chain: inf from depth 2 on, so P(tau = 5) = 1 where exactly 1/4); the
# backward walk accepts X^4 with probability 1/16 and X^3 (w_3 = 2.5e199) surely
_UP_DOWN = ((0, 0, 0, 0, 0),
            [np.array([1e-200, 0.5, 0.5 - 1e-200]), np.array([1e-200, 0.5, 0.5 - 1e-200]),
             np.array([0.5, 0.25, 0.25]), np.array([0.5, 0.25, 0.25]), np.array([0.5, 0.45, 0.05])],
            [np.array([0.5, 0.25, 0.25]), np.array([0.5, 0.25, 0.25]), np.array([0.5e-200, 0.5, 0.5 - 0.5e-200]),
             np.array([0.5e-200, 0.25, 0.75 - 0.5e-200]), np.array([0.5, 0.1, 0.4])])
# the mirror image: two ratios of 1e-200 underflow (w_2 = 1e-400 -> 0), then two of 5e199 give w_4 = 0.25
_DOWN_UP = ((0, 0, 0, 0),
            [np.array([0.5, 0.5]), np.array([0.5, 0.5]), np.array([1e-200, 1.0]), np.array([1e-200, 1.0])],
            [np.array([0.5e-200, 1.0]), np.array([0.5e-200, 1.0]), np.array([0.5, 0.5]), np.array([0.5, 0.5])])
# a subnormal draft probability: q / p overflows to inf in one division (w_1 = 0.5 / 5e-324, above 2**900)
_SUBNORMAL = ((0, 1), [np.array([5e-324, 1.0]), np.array([0.5, 0.5])], [np.array([0.5, 0.5]), np.array([0.5, 0.5])])
_PATHS = [_UP_DOWN, _DOWN_UP, _SUBNORMAL]

_VALUES = st.one_of(
    st.floats(min_value=1e-3, max_value=1.0),
    st.sampled_from([0.0, 5e-324, 1e-310, 1e-300, 1e-200, 1e-160, 1e-100, 1e-17, 0.25, 0.5, 1.0]),
)


def _exact_chains(px, qx):
    """``W_k``, ``P_k`` (``k = 1..L``) in rationals, from their definition."""
    W, PW, ws, pws = Fraction(1), Fraction(1), [], []
    for s, b in zip(px, qx):
        s, b = Fraction(float(s)), Fraction(float(b))
        r = b / s if s > 0 else Fraction(1)
        W, PW = W * r, min(PW * r, Fraction(1))
        ws.append(W)
        pws.append(PW)
    return ws, pws


def _float_rows(px, qx):
    """The plain float chains of rows of paths, as the callers form them (running products, numpy)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        ratio = np.where(px > 0, qx / np.where(px > 0, px, 1.0), 1.0)
        w = np.cumprod(ratio, axis=-1)
        pw = np.empty_like(w)
        run = np.ones(w.shape[0])
        for i in range(w.shape[1]):
            run = np.minimum(run * ratio[:, i], 1.0)
            pw[:, i] = run
    return w, pw


def _close(got, exact, L):
    """``got`` within ``4 (L + 2)`` roundings of ``exact``, or within the least subnormal (a value in the subnormal
    range keeps only its absolute accuracy); above 2**900, also 2**900 itself (the stand-in of a recomputed chain:
    a float chain that stayed finite keeps its value)."""
    if exact > BIG_WEIGHT and got == BIG_WEIGHT:
        return True
    want = float(exact) if exact < 2**1023 else math.inf
    return abs(got - want) <= 4 * (L + 2) * EPS * want + TINY


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 3).flatmap(lambda R: st.integers(1, 6).flatmap(lambda L: st.tuples(
    st.lists(st.lists(_VALUES, min_size=L, max_size=L), min_size=R, max_size=R),
    st.lists(st.lists(_VALUES, min_size=L, max_size=L), min_size=R, max_size=R)))))
@example(rows=([[1e-200, 1e-200, 0.5]], [[0.5, 0.5, 1e-300]]))
@example(rows=([[0.5, 0.5, 1e-200, 1e-200]], [[1e-200, 1e-200, 0.5, 0.5]]))
@example(rows=([[5e-324, 0.5], [1.0, 1.0]], [[0.5, 0.0], [1e-310, 1.0]]))
def test_path_weight_rows_match_rationals(rows):
    """The array helper on numpy and torch rows, and the recomputed chains alone at every entry, against
    rationals: every entry within a few roundings of the exact chain (a plain running
    product fails here: ``inf``/``nan``/``0``; a route through logarithms fails the bound, its error growing with
    ``|log w|``); the entries whose float chain stayed normal are the callers' float products bit for
    bit; numpy and torch give the same bits; the one-path helper's values are the exact ones rounded once."""
    import array_api_compat.torch as xpt

    px, qx = np.array(rows[0]), np.array(rows[1])
    R, L = px.shape
    w, pw = _float_rows(px, qx)
    got_np = path_weight_rows(px, qx, np, lambda: (w, pw), onestep=True)
    tp, tq = torch.from_numpy(px), torch.from_numpy(qx)
    got_t = path_weight_rows(tp, tq, xpt, lambda: (torch.from_numpy(w), torch.from_numpy(pw)), onestep=True)
    for a, b in zip(got_np, got_t):
        np.testing.assert_array_equal(a, b.numpy())
    # the recomputed chains alone, every entry (what replaces a lost entry), on torch
    dev = [a.numpy() for a in _scaled_chains(tp, tq, tp > 0, xpt, True, True)]
    for r in range(R):
        W, PW = _exact_chains(px[r], qx[r])
        fw, fpw, _, _ = float_chains(px[r], qx[r])
        one_w, one_pw = path_weights(px[r], qx[r])
        for k in range(L):
            for got_w, got_pw in (got_np, dev):
                assert _close(got_w[r, k], W[k], L), (r, k, got_w[r, k], float(W[k]))
                assert _close(got_pw[r, k], PW[k], L), (r, k, got_pw[r, k], float(PW[k]))
            assert one_w[k + 1] == (BIG_WEIGHT if W[k] > BIG_WEIGHT else float(W[k])) or fw == one_w
            assert one_pw[k + 1] == float(PW[k]) or fpw == one_pw
        # the float chains kept where they stayed normal (the rule of float_chains, prefix by prefix)
        for chain, got in ((fw, got_np[0][r]), (fpw, got_np[1][r])):
            n = 0
            while n < L and _normal_prefix(px[r][: n + 1], qx[r][: n + 1], chain is fw):
                n += 1
            np.testing.assert_array_equal(got[:n], chain[1 : n + 1])


def _paths_past_the_range(test):
    """``test`` on 25 paths of :func:`block_paths` and on ``_UP_DOWN``, ``_DOWN_UP`` and ``_SUBNORMAL``."""
    for path in (_SUBNORMAL, _DOWN_UP, _UP_DOWN):
        test = example(path=path)(test)
    return settings(max_examples=25, deadline=None)(given(path=block_paths(max_l=4))(test))


_ROWS = st.integers(1, 3).flatmap(lambda R: st.integers(1, 6).flatmap(lambda L: st.tuples(
    st.lists(st.lists(_VALUES, min_size=L, max_size=L), min_size=R, max_size=R),
    st.lists(st.lists(_VALUES, min_size=L, max_size=L), min_size=R, max_size=R))))


@settings(max_examples=80, deadline=None)
@given(rows=_ROWS)
@example(rows=([[1e-200, 1e-200, 0.5]], [[0.5, 0.5, 1e-300]]))
@example(rows=([[0.5, 0.5], [0.5, 0.5]], [[0.0, 1e-300], [1e-300, 1e-300]]))
def test_chains_lost_is_float_chains_rule(rows):
    """:func:`chains_lost` on the host copy of rows of float chains is true exactly when the one-path rule
    (:func:`float_chains`, by its own loop) finds some row's chain lost, for each chain asked for and both (a
    check by the extremes alone fails on rows with an exact zero after a zero ratio; one ignoring the ratios
    fails where a subnormal ratio meets a large weight and the product stays normal)."""
    px, qx = np.array(rows[0]), np.array(rows[1])
    w, pw = _float_rows(px, qx)
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.where(px > 0, qx / np.where(px > 0, px, 1.0), 1.0)
    ok = [float_chains(a, b)[2:] for a, b in zip(px, qx)]
    assert chains_lost(ratio, w, None) == (not all(o[0] for o in ok))
    assert chains_lost(ratio, None, pw) == (not all(o[1] for o in ok))
    assert chains_lost(ratio, w, pw) == (not all(o[0] and o[1] for o in ok))


@_paths_past_the_range
def test_profile_walk_reads_the_float_chains_and_recomputes_only_lost_ones(path):
    """The profile's batched quantities on torch laws (:func:`prefill_batched`, the walk's one read): block
    verification's :math:`E[\\tau]` and target calls of both schemes are those of the exact route
    (:func:`_block_tau_calls` without ``deferred``: :func:`path_weight_rows`' chains) bit for bit, on paths whose
    chains stay in range and on paths whose chains leave it (``_UP_DOWN``: the float chain's values give
    ``P(tau = 5) = 1`` where exactly 1/4); one read when no chain lost an entry (:func:`float_chains`' rule), a
    second (the values recomputed) when one did. A route that kept the float chains' values fails on
    ``_UP_DOWN``; one recomputing at every position fails the count of reads."""
    import array_api_compat.torch as xpt

    import otspec.profile._quantities as PQ

    block, cs, cb = path
    L = len(block)
    P, Q = torch.from_numpy(np.stack(cs))[None], torch.from_numpy(np.stack(list(cb) + [cb[-1]]))[None]
    X = np.array([block], dtype=np.int64)
    names = ("block", "block-onestep")
    want = PQ.to_host(PQ._block_tau_calls(names, P, Q, torch.from_numpy(X), L, xpt))  # (2, 2, 1, L)
    builds = PQ.Builds(X, P, Q, {})
    reads, real = [], PQ.to_host
    PQ.to_host = lambda a: reads.append(a) or real(a)
    try:
        PQ.prefill_batched([builds], (), names, lambda name: (1,), L)
    finally:
        PQ.to_host = real
    for f, name in enumerate(names):
        np.testing.assert_array_equal(np.asarray(builds._batched[("block", name, L)]).ravel(), want[f].ravel())
    px = [c[x] for c, x in zip(cs, block)]
    qx = [c[x] for c, x in zip(cb, block)]
    lost = not all(float_chains(px, qx)[2:])
    assert len(reads) == 1 + lost, (len(reads), lost)


def _normal_prefix(px, qx, block: bool) -> bool:
    _, _, ok_w, ok_p = float_chains(px, qx)
    return ok_w if block else ok_p


def _torch_rows(path):
    block, cs, cb = path
    P = torch.from_numpy(np.stack(cs))
    Q = torch.from_numpy(np.stack(list(cb) + [cb[-1]]))
    return torch.tensor(block), P, Q


def _assert_law(got, exact, L, V):
    """The bound of tests/test_properties_cm.py's path laws: each entry a product of at most ``L + 1`` factors in
    [0, 1], each within ``(V + L + 2)`` roundings (plus the least subnormal of a weight in that range)."""
    assert np.all(np.asarray(got) >= 0.0)
    np.testing.assert_allclose(got, [float(e) for e in exact], rtol=0, atol=8 * (L + 1) * (V + L + 2) * EPS)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@settings(max_examples=25, deadline=None)
@given(path=block_paths(max_l=4))
@example(path=_UP_DOWN)
@example(path=_DOWN_UP)
@example(path=_SUBNORMAL)
def test_profile_block_path_laws_match_rationals_past_the_range(engine, path):
    """The profile's batched laws of both schemes and every draft length, and ``"block"``'s :math:`E[\\tau]`, on
    paths whose drafted tokens may have probabilities of 1e-300, 1e-200 or subnormal: equal to the rational law
    (before: ``P(tau = 5) = 1`` on ``_UP_DOWN``, exactly 1/4; nan where ``inf * 0`` met a zero); numpy, and torch
    (on the CPU the route an accelerator takes: nothing read)."""
    block, cs, cb = path
    P, Q, X = np.stack(cs)[None], np.stack(list(cb) + [cb[-1]])[None], np.array([block], dtype=np.int64)
    if engine == "torch":
        P, Q, X = torch.from_numpy(P), torch.from_numpy(Q), torch.from_numpy(X)
    L, V = len(block), len(cs[0])
    names = ("block", "block-onestep")
    for chosen in (names, names[:1], names[1:]):
        got = np.asarray(block_path_laws_stack(chosen, P, Q, X, L))
        for f, name in enumerate(chosen):
            for ell in range(1, L + 1):
                exact = _exact_tau_law(name, block[:ell], cs[:ell], cb[:ell])
                _assert_law(got[f, 0, ell - 1, : ell + 1], exact, ell, V)
                assert np.all(got[f, 0, ell - 1, ell + 1:] == 0.0)
    tau = np.asarray(_block_tau_calls(("block",), P, Q, X, L, _xp(P)))[0, 0, 0]
    for ell in range(1, L + 1):
        exact = sum(t * e for t, e in enumerate(_exact_tau_law("block", block[:ell], cs[:ell], cb[:ell])))
        assert abs(tau[ell - 1] - float(exact)) <= 8 * (ell + 1) ** 2 * (V + ell + 2) * EPS


def _xp(a):
    import array_api_compat

    return array_api_compat.array_namespace(a)


@_paths_past_the_range
def test_decoder_device_routes_match_rationals_past_the_range(path):
    """The accelerator's routes on CPU tensors: :func:`block_walk_t`'s logged numbers give the rational law of
    ``"block"`` (:func:`backward_law`), :func:`block_onestep_tau_law_t` that of ``"block-onestep"``; and
    :func:`otspec.block.tau_law_on_path` agrees with both."""
    from otspec.block._verifiers import backward_law
    from otspec.decoding._verifiers import block_onestep_tau_law_t, block_walk_t

    block, cs, cb = path
    L, V = len(block), len(cs[0])
    x, P, Q = _torch_rows(path)
    _, _, w, sums = block_walk_t(x, P, Q, torch.Generator().manual_seed(0))
    got = backward_law(float(w[L]), [tuple(s) for s in sums.tolist()])
    exact = _exact_tau_law("block", block, cs, cb)
    _assert_law(got, exact, L, V)
    _assert_law(tau_law_on_path("block", block, cs, cb), exact, L, V)
    law1 = block_onestep_tau_law_t(x, P, Q)[0].numpy()
    exact1 = _exact_tau_law("block-onestep", block, cs, cb)
    _assert_law(law1, exact1, L, V)


def test_block_walk_t_draws_tau_from_the_exact_law_past_the_range():
    """:func:`block_walk_t`'s accepted length on ``_UP_DOWN`` (the weight overflows at depth 2 and comes back to
    1/4): chi-square of 600 draws against the rational law, ``P(tau = 3, 4, 5) = (3/4 15/16, 3/4 1/16, 1/4)``;
    the plain float chain drew ``tau = 5`` every time."""
    from otspec.decoding._verifiers import block_walk_t
    from otspec.testing import chi2_gof

    block, cs, cb = _UP_DOWN
    exact = np.array([float(e) for e in _exact_tau_law("block", block, cs, cb)])
    np.testing.assert_allclose(exact, [0, 0, 0, 0.75 * 15 / 16, 0.75 / 16, 0.25], rtol=1e-12, atol=0)
    x, P, Q = _torch_rows(_UP_DOWN)
    gen = torch.Generator().manual_seed(5)
    counts = np.zeros(6, dtype=np.int64)
    for _ in range(600):  # the least cell expects 28 draws
        counts[int(block_walk_t(x, P, Q, gen)[0])] += 1
    assert counts[:3].sum() == 0
    assert chi2_gof(counts[3:], exact[3:], alpha_fail=ALPHA_FAIL).passed, counts


# ----------------------------------------------------------------------------- the decoder's host routes


def _tiny_pair(V: int = 4):
    r"""``(target, draft)`` second-order tables on ``V`` tokens: the draft gives token 0 about ``e^{-460} \approx
    1e-200`` everywhere; the target gives it 1/4 unless the last two tokens are 0 and 0, then about ``e^{-700}
    \approx 1e-304``. Drafting token 0 six times: ratios ``2.5e199`` twice (the product overflows), then
    ``1e-104`` four times: the exact weights come back to about ``6e-18``."""
    import otspec.decoding as D
    from tests.toy_lm import table_fn

    tq = torch.zeros(V, V, V, dtype=torch.float64)
    tq[0, 0, 0] = -700.0
    tp = torch.zeros(V, V, V, dtype=torch.float64)
    tp[:, :, 0] = -460.0
    return D.CallableLM(table_fn(tq), V), D.CallableLM(table_fn(tp), V)


@pytest.mark.parametrize("verifier", ["block", "block-onestep"])
def test_decoder_host_route_logs_the_rational_law_past_the_range(verifier, monkeypatch):
    """The torch route reading the host (``_block_on_host``, ``_block_onestep_on_host``) with every draft forced to
    the draft's least likely token (token 0, about 1e-200): the logged law of the accepted length (its
    :math:`P(\\tau \\ge j)` and mean) equals the rational law of the rows it read (before, ``"block"``: ``P(tau = 6)
    = 1``, exactly about 6e-18)."""
    import otspec.decoding as D
    from otspec.decoding import _loop

    def least_likely(P):  # the draft's draws: the token of least positive probability of each row
        P = np.asarray(P)
        return np.argmin(np.where(P > 0, P, np.inf), axis=-1)

    rows = []
    real_laws_into = _loop._laws_into

    def laws_into(smp, logits, out):
        got = real_laws_into(smp, logits, out)
        rows.append(np.array(got.detach().cpu().numpy()))
        return got

    monkeypatch.setattr(_loop, "sample_rows", lambda P, gen: least_likely(P))  # "block"'s draws
    def draw_rows_on(host, W, gen, out=None, ids=None):  # the draft's draws: the least likely token, written to ids
        got = torch.from_numpy(least_likely(W))
        return got if ids is None else ids.copy_(got)

    monkeypatch.setattr(_loop, "_draw_rows_on", draw_rows_on)
    monkeypatch.setattr(_loop._Decoder, "read_on_host", None)
    monkeypatch.setattr(_loop, "_laws_into", laws_into)
    target, draft = _tiny_pair()
    L = 6
    res = D.speculative_decode(prompt=[1, 2, 3], draft=draft, target=target, L=L, max_new_tokens=L + 1, rng=0,
                               verifier=verifier, engine="torch")
    # the laws formed: the draft's L rows one by one, then the target's first L rows in one block
    cs = [r[0] for r in rows[:L]]
    cb = list(rows[L][:L])
    assert list(res.tokens[: int(res.accepted[0])]) == [0] * int(res.accepted[0])
    assert all(c[0] < 1e-199 for c in cs)
    exact = _exact_tau_law(verifier, (0,) * L, cs, cb)
    if verifier == "block":
        assert float(exact[L]) < 1e-16  # the weight came back far below 1
    want_reached = [float(sum(exact[j:])) for j in range(1, L + 1)]
    np.testing.assert_allclose(np.asarray(res.predicted_reached)[0], want_reached, rtol=0,
                               atol=8 * (L + 1) * (4 + L + 2) * EPS)
    assert math.isclose(float(res.predicted_accepted[0]), float(sum(t * e for t, e in enumerate(exact))), rel_tol=0,
                        abs_tol=8 * (L + 1) ** 2 * (4 + L + 2) * EPS)
