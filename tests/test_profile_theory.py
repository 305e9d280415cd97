"""What a profile estimates: emission probabilities, the start recursion and the ratio estimator.

Every quantity is checked on tiny Markov draft/target pairs (V <= 4) against an
independent exact route: the emitted law of one iteration by enumeration of
the drafts (SpecTr's exact decoded law, the block verifier's exact tau law),
and the iteration starts of real decoding by enumeration of every decoding
trajectory. Notation: ``p`` draft, ``q`` target.
"""

import itertools
import math

import numpy as np
import pytest

import otspec.profile as prof
from otspec.block import BlockVerifyOneStep
from otspec.models import random_markov_model
from otspec.spectr import decoded_law, spectr_step

V, L = 3, 2


class _Shifted:
    """A model seen from a context: ``next_dist(prefix)`` is the law after ``ctx + prefix``."""

    max_len = None

    def __init__(self, model, ctx):
        self.model, self.ctx, self.vocab_size = model, tuple(ctx), model.vocab_size

    def next_dist(self, prefix):
        return self.model.next_dist(self.ctx + tuple(prefix))


def _onestep_law(draft, target, ctx, L):
    """Emitted law of one-step block verification by enumeration of the draft blocks.

    P(tau = t | block) from the package's exact tables; the correction token
    from the algorithm's definition (Sun et al., arXiv:2403.10444, one
    correction token): ``(w_t M_b(.|X^t) - M_s(.|X^t))_+`` normalised, ``w`` the
    block weights, or the bonus from ``M_b(.|X^L)``.
    """
    v = BlockVerifyOneStep(_Shifted(draft, ctx), _Shifted(target, ctx), L)
    law: dict = {}
    for block in itertools.product(range(draft.vocab_size), repeat=L):
        ps = [draft.next_dist(ctx + block[:i]) for i in range(L + 1)]
        qs = [target.next_dist(ctx + block[:i]) for i in range(L + 1)]
        pb = math.prod(ps[i][block[i]] for i in range(L))
        tau = v.tau_given_block(block)
        w = [1.0]
        for i in range(L):
            w.append(min(w[-1] * qs[i][block[i]] / ps[i][block[i]], 1.0))
        for t in range(L + 1):
            if t < L:
                c = np.maximum(w[t] * qs[t] - ps[t], 0.0)
                c = c / c.sum() if c.sum() > 0 else qs[t]
            else:
                c = qs[L]
            for z in range(draft.vocab_size):
                key = block[:t] + (z,)
                law[key] = law.get(key, 0.0) + pb * tau[t] * c[z]
    return law


def _iteration_law(draft, target, scheme, k, ctx, L):
    """Exact law of the tokens one iteration emits at ``ctx`` (dict: tuple -> probability)."""
    if scheme == "block-onestep":
        return _onestep_law(draft, target, tuple(ctx), L)
    return decoded_law(draft, target, k, L, verifier=scheme, prefix=tuple(ctx))


def _pair(seed, V=V):
    return random_markov_model(V, 1, rng=seed), random_markov_model(V, 1, rng=seed + 100)


def _laws_along(model, texts):
    """``(n, T, V)`` laws after every prefix of every text."""
    texts = np.asarray(texts)
    if getattr(model, "order", None) == 1:  # first-order Markov: one table lookup
        first = np.broadcast_to(model.next_dist(()), (texts.shape[0], 1, model.vocab_size))
        return np.concatenate([first, model.transition[texts[:, :-1]]], axis=1)
    return np.array([[model.next_dist(tuple(y[:t])) for t in range(len(y))] for y in texts])


# ----------------------------------------------------------------------------- (i) emission probabilities
CASES = [("token", 1), ("block-onestep", 1), ("kseq", 2), ("kseq", 3), ("multiround", 2), ("multiround", 3),
         ("optimal", 2), pytest.param("optimal", 3, marks=pytest.mark.slow), ("khisti", 2)]


@pytest.mark.parametrize(("scheme", "k"), CASES)
def test_emission_probs_equal_enumeration(scheme, k):
    draft, target = _pair(3)
    for ctx in [(), (2, 1)]:
        law = _iteration_law(draft, target, scheme, k, ctx, L)
        paths = np.array(list(itertools.product(range(V), repeat=L + 1)))
        texts = [ctx + tuple(y) for y in paths]
        P = _laws_along(draft, texts)[:, len(ctx):]
        Q = _laws_along(target, texts)[:, len(ctx):]
        e = prof.emission_probs(scheme, P, Q, paths, k=k)
        want = np.array([[law.get(tuple(y[:j]), 0.0) for j in range(1, L + 2)] for y in paths])
        np.testing.assert_allclose(e, want, rtol=0, atol=1e-12)
        if prof.RENEWAL_SCHEMES.get(scheme) and scheme != "block-onestep":
            # the closed form against the verifier's exact conditional law over enumerated draft tuples
            e2 = prof.emission_probs(scheme, P, Q, paths, k=k, method="enumerate")
            np.testing.assert_allclose(e, e2, rtol=0, atol=1e-12)


def test_emission_probs_token_closed_form_by_hand():
    p = np.array([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])
    q = np.array([[0.25, 0.75], [0.3, 0.7], [0.6, 0.4]])
    y = np.array([1, 1, 0])
    e = prof.emission_probs("token", p, q, y)
    np.testing.assert_allclose(e, [0.25, 0.5 * 0.6, 0.5 * 0.1 * 0.6], rtol=0, atol=1e-15)


def test_emission_probs_mc_is_close_and_seeded():
    draft, target = _pair(5)
    paths = np.array(list(itertools.product(range(V), repeat=L + 1)))[[0, 13]]
    P, Q = _laws_along(draft, paths), _laws_along(target, paths)
    exact = prof.emission_probs("kseq", P, Q, paths, k=2)
    a = prof.emission_probs("kseq", P, Q, paths, k=2, method="mc", n_draws=500, rng=1)
    b = prof.emission_probs("kseq", P, Q, paths, k=2, method="mc", n_draws=500, rng=1)
    np.testing.assert_array_equal(a, b)
    # each W entry averages 500 terms in [0, 1] (Hoeffding: off by 0.1 with probability < 1e-4), and e is a
    # sum of products of such entries along at most L + 1 depths: within 0.1 of the exact value
    np.testing.assert_allclose(a, exact, rtol=0, atol=0.1)
    assert np.abs(a - exact).max() > 0  # sampled, not the exact route


def test_emission_probs_along_matches_per_path():
    draft, target = _pair(7)
    rng = np.random.default_rng(0)
    y = rng.integers(0, V, size=(2, 7))
    P, Q = _laws_along(draft, y), _laws_along(target, y)
    for scheme, k in [("token", 1), ("kseq", 2), ("block-onestep", 1)]:
        e = prof.emission_probs_along(scheme, P, Q, y, k=k, L=L)
        for s in range(7 - L):
            np.testing.assert_allclose(
                e[:, s], prof.emission_probs(scheme, P[:, s : s + L + 1], Q[:, s : s + L + 1], y[:, s : s + L + 1],
                                             k=k), rtol=0, atol=1e-15)
        # past the end of the text: zero
        assert e[:, -1, 1:].max() == 0.0 and e[:, -2, 2:].max() == 0.0


def test_emission_probs_from_token_probs_and_chunks(monkeypatch):
    draft, target = _pair(9)
    y = np.random.default_rng(4).integers(0, V, size=(3, 9))
    P, Q = _laws_along(draft, y), _laws_along(target, y)
    py = np.take_along_axis(P, y[..., None], axis=-1)[..., 0]
    qy = np.take_along_axis(Q, y[..., None], axis=-1)[..., 0]
    for scheme in ("token", "block-onestep"):
        np.testing.assert_array_equal(prof.emission_probs_from_token_probs(scheme, py, qy, L=3),
                                      prof.emission_probs_along(scheme, P, Q, y, L=3))
    whole = prof.emission_probs_along("multiround", P, Q, y, k=3, L=3)
    monkeypatch.setattr("otspec.profile._renewal._CHUNK_ELEMENTS", 2 * V)  # two positions per chunk
    np.testing.assert_array_equal(prof.emission_probs_along("multiround", P, Q, y, k=3, L=3), whole)
    with pytest.raises(ValueError, match="`scheme` must be 'token' or 'block-onestep'"):
        prof.emission_probs_from_token_probs("kseq", py, qy, L=2)
    with pytest.raises(ValueError, match="`q_y` must hold probabilities"):
        prof.emission_probs_from_token_probs("token", py, qy + 1, L=2)
    with pytest.raises(ValueError, match="one shape"):
        prof.emission_probs_from_token_probs("token", py, qy[:, 1:], L=2)


# ----------------------------------------------------------------------------- (ii) starts by enumeration of real decoding
def _exact_starts(draft, target, scheme, k, L, T):
    """P(t is a start, Y_{<t} = prefix) for every prefix of length t < T, by enumerating every run."""
    laws: dict = {}
    starts = {(): 1.0}
    frontier = [()]
    for t in range(T):
        for pre in [f for f in frontier if len(f) == t]:
            w = starts[pre]
            if pre not in laws:
                laws[pre] = _iteration_law(draft, target, scheme, k, pre, L)
            for z, pz in laws[pre].items():
                nxt = pre + z
                if len(nxt) < T and pz > 0:
                    if nxt not in starts:
                        starts[nxt] = 0.0
                        frontier.append(nxt)
                    starts[nxt] += w * pz
    return starts


@pytest.mark.parametrize(("scheme", "k", "T"), [("token", 1, 5), ("block-onestep", 1, 5), ("kseq", 2, 4),
                                                ("multiround", 2, 4),
                                                pytest.param("optimal", 2, 4, marks=pytest.mark.slow)])
def test_recursion_equals_enumeration_of_real_decoding(scheme, k, T):
    draft, target = _pair(11)
    texts = np.array(list(itertools.product(range(V), repeat=T)))
    P, Q = _laws_along(draft, texts), _laws_along(target, texts)
    log_q = np.log(np.take_along_axis(Q, texts[..., None], axis=-1)[..., 0])
    e = prof.emission_probs_along(scheme, P, Q, texts, k=k, L=L)
    r = prof.starts_recursion(e, log_q)
    starts = _exact_starts(draft, target, scheme, k, L, T)
    want = np.array([[starts.get(tuple(y[:t]), 0.0) / math.exp(log_q[n, :t].sum()) for t in range(T)]
                     for n, y in enumerate(texts)])
    np.testing.assert_allclose(r, want, rtol=0, atol=1e-12)
    # E_y[sum_t r(t)] = E[#target calls for T tokens], and the texts' weights are the target's (lossless)
    w = np.exp(log_q.sum(axis=1))
    calls = sum(v for v in starts.values())
    np.testing.assert_allclose(float(w @ r.sum(axis=1)), calls, rtol=0, atol=1e-12)
    # renewal-reward: sum_t E_y[r(t) m(y_<t)] = E[tokens emitted by the iterations begun before T], overshoot included
    m = {}
    for y in texts:
        for t in range(T):
            pre = tuple(y[:t])
            if pre not in m:
                m[pre] = sum(len(z) * pz for z, pz in _iteration_law(draft, target, scheme, k, pre, L).items())
    emitted = sum(wt * m[pre] for pre, wt in starts.items())
    mpos = np.array([[m[tuple(y[:t])] for t in range(T)] for y in texts])
    np.testing.assert_allclose(float(w @ (r * mpos).sum(axis=1)), emitted, rtol=0, atol=1e-12)


def test_recursion_lengths_mask_and_bounds():
    draft, target = _pair(2)
    y = np.random.default_rng(3).integers(0, V, size=(3, 8))
    P, Q = _laws_along(draft, y), _laws_along(target, y)
    e = prof.emission_probs_along("token", P, Q, y, L=L)
    log_q = np.log(np.take_along_axis(Q, y[..., None], axis=-1)[..., 0])
    r = prof.starts_recursion(e, log_q)
    assert r.min() >= 0.0 and r.max() <= 1.0 + 1e-12
    rl = prof.starts_recursion(e, log_q, lengths=[8, 5, 1])
    np.testing.assert_array_equal(rl[1, :5], r[1, :5])
    assert rl[1, 5:].max() == 0.0 and rl[2, 1:].max() == 0.0
    est = prof.tokens_per_call(e, log_q, lengths=[8, 5, 1])
    np.testing.assert_allclose(est.starts, rl.sum(axis=1), rtol=0, atol=0)
    assert est.tokens.tolist() == [8, 5, 1] and est.n_texts == 3
    np.testing.assert_allclose(est.tokens_per_call, 14 / rl.sum(), rtol=1e-15)


# ----------------------------------------------------------------------------- (iii) prediction vs simulated real decoding
def _sample_texts(model, n, T, gen):
    """``n`` texts of length ``T`` from a first-order Markov model (inverse CDF on its tables)."""
    out = np.empty((n, T), dtype=np.int64)
    u = gen.random((n, T))
    for t in range(T):
        law = np.broadcast_to(model.next_dist(()), (n, model.vocab_size)) if t == 0 else model.transition[out[:, t - 1]]
        out[:, t] = np.minimum((np.cumsum(law, axis=1) < u[:, t : t + 1]).sum(axis=1), model.vocab_size - 1)
    return out


def _kernels(draft, target, scheme, k, L):
    """Emitted law of one iteration per state of a first-order Markov pair: the empty context, then the last token."""
    keys = [()] + [(u,) for u in range(draft.vocab_size)]
    return {key: _iteration_law(draft, target, scheme, k, key, L) for key in keys}


def _simulate(kernels, T, n, gen):
    """Target calls and emitted tokens (overshoot included) of ``n`` real decodes of ``T`` tokens."""
    tables = {key: (list(law), np.array(list(law.values())) / sum(law.values())) for key, law in kernels.items()}
    calls, emitted = np.zeros(n), np.zeros(n)
    for i in range(n):
        t, last = 0, ()
        while t < T:
            seqs, w = tables[last]
            z = seqs[gen.choice(len(seqs), p=w)]
            calls[i] += 1
            t += len(z)
            last = (z[-1],)
        emitted[i] = t
    return calls, emitted


def _predict(draft, target, scheme, k, T, n, gen):
    """The ratio estimator over ``n`` target-sampled texts of length ``T``, and the start probabilities."""
    texts = _sample_texts(target, n, T, gen)
    P, Q = _laws_along(draft, texts), _laws_along(target, texts)
    log_q = np.log(np.take_along_axis(Q, texts[..., None], axis=-1)[..., 0])
    e = prof.emission_probs_along(scheme, P, Q, texts, k=k, L=L)
    return prof.tokens_per_call(e, log_q), prof.starts_recursion(e, log_q), texts


def _assert_z(pred, real):
    """Mean per text, predicted vs real decoding: |z| < 4 (false-failure rate 6.3e-5, two-sided normal)."""
    n1, n2 = pred.shape[0], real.shape[0]
    z = (pred.mean() - real.mean()) / math.sqrt(pred.var(ddof=1) / n1 + real.var(ddof=1) / n2)
    assert abs(z) < 4.0, (z, pred.mean(), real.mean())


@pytest.mark.parametrize(("scheme", "k", "n"), [("token", 1, 3000),
                                                pytest.param("kseq", 2, 3000, marks=pytest.mark.slow)])
def test_predicted_calls_agree_with_simulated_decoding(scheme, k, n):
    # real decoding simulated from the exact emitted law of one iteration per context (enumerated)
    T = 12
    draft, target = _pair(21)
    gen = np.random.default_rng(12345)
    est, r, texts = _predict(draft, target, scheme, k, T, n, gen)
    kernels = _kernels(draft, target, scheme, k, L)
    calls, emitted = _simulate(kernels, T, n, gen)
    _assert_z(est.starts, calls)
    # the recursion's per-text spread is smaller than real decoding's (it averages the run's randomness)
    assert est.starts.std() < calls.std()
    # the Palm-weighted profile predicts the tokens emitted by the iterations begun before T (overshoot included)
    m = np.array([sum(len(z) * w for z, w in kernels[key].items()) for key in [()] + [(u,) for u in range(V)]])
    m_pos = np.concatenate([np.full((n, 1), m[0]), m[1 + texts[:, :-1]]], axis=1)
    _assert_z((r * m_pos).sum(axis=1), emitted)


def test_ratio_estimator_bias_and_std_error():
    # 1500 replicate estimates from 4 texts each against the exact T / E[calls] (Markov renewal): the
    # delta-method bias, subtracted, leaves a mean within 4 standard errors of the truth (false failure 6.3e-5),
    # and the delta-method standard error matches the spread of the replicates within 20 %
    T, n, reps = 12, 4, 1500
    draft, target = _pair(21)
    calls, _, _, _, _ = _exact_markov_renewal(draft, target, "token", 1, L, T)
    gen = np.random.default_rng(99)
    texts = _sample_texts(target, n * reps, T, gen)
    P, Q = _laws_along(draft, texts), _laws_along(target, texts)
    log_q = np.log(np.take_along_axis(Q, texts[..., None], axis=-1)[..., 0])
    e = prof.emission_probs_along("token", P, Q, texts, L=L).reshape(reps, n, T, L + 1)
    ests = [prof.tokens_per_call(e[i], log_q.reshape(reps, n, T)[i]) for i in range(reps)]
    R = np.array([x.tokens_per_call for x in ests])
    corrected = R - np.array([x.bias for x in ests])
    se = corrected.std(ddof=1) / math.sqrt(reps)
    assert abs(corrected.mean() - T / calls) < 4 * se
    np.testing.assert_allclose(np.mean([x.std_error for x in ests]), R.std(ddof=1), rtol=0.2)


@pytest.mark.slow
@pytest.mark.parametrize(("scheme", "k"), [("token", 1), ("kseq", 2), ("multiround", 2), ("optimal", 2)])
def test_predicted_calls_agree_with_spectr_steps(scheme, k):
    # end to end with the package's own iteration (spectr_step), n = 4000 runs; |z| < 4 (false failure 6.3e-5)
    T, n = 12, 4000
    draft, target = _pair(21)
    gen = np.random.default_rng(7)
    est, _, _ = _predict(draft, target, scheme, k, T, n, gen)
    real = np.zeros(n)
    for i in range(n):
        ctx: tuple = ()
        while len(ctx) < T:
            ctx += spectr_step(draft, target, k, L, verifier=scheme, prefix=ctx, rng=gen)
            real[i] += 1
    _assert_z(est.starts, real)


# ----------------------------------------------------------------------------- (iv) the per-position average is biased
def _exact_markov_renewal(draft, target, scheme, k, L, T):
    """Exact expectations of real decoding of ``T`` tokens on a first-order Markov pair, and the stationary limits.

    An iteration's emitted law depends only on the last token (or on the
    empty context at the start), so the starts form a Markov renewal process
    over (position, last token). Returns E[calls], E[tokens emitted by the
    iterations begun before T], E[per-position average of m = E[tau + 1]],
    and in the limit T -> infinity the Palm mean of m (tokens per call) and
    the stationary per-position mean of m.
    """
    Vm = draft.vocab_size
    kernels = _kernels(draft, target, scheme, k, L)
    keys = list(kernels)
    m = np.array([sum(len(z) * w for z, w in kernels[key].items()) for key in keys])
    start = np.zeros((T, len(keys)))  # P(t is a start, last token = key)
    start[0, 0] = 1.0
    K = np.zeros((Vm, Vm))  # last token at a start -> last token at the next start
    for a, key in enumerate(keys[1:]):
        for z, w in kernels[key].items():
            K[a, z[-1]] += w
    for t in range(T):
        for a, key in enumerate(keys):
            for z, w in kernels[key].items():
                if t + len(z) < T:
                    start[t + len(z), 1 + z[-1]] += start[t, a] * w
    marg = [np.eye(len(keys))[0]]  # law of the context's last token at each position, under the target
    for t in range(1, T):
        prev = target.next_dist(()) if t == 1 else marg[-1][1:] @ target.transition
        marg.append(np.concatenate([[0.0], prev]))
    naive = float(np.mean([mg @ m for mg in marg]))

    def stationary(M):
        w, vec = np.linalg.eig(M.T)
        x = np.real(vec[:, np.argmin(np.abs(w - 1))])
        return x / x.sum()

    pi, mu = stationary(K), stationary(target.transition)
    return float(start.sum()), float((start @ m).sum()), naive, float(pi @ m[1:]), float(mu @ m[1:])


def test_per_position_average_is_biased_exact_numbers():
    # token verifier, V = 4, L = 2, T = 24, bigram draft and target (random_markov_model seeds 4 and 104)
    draft, target = _pair(4, V=4)
    T = 24
    calls, emitted, naive, palm_lim, naive_lim = _exact_markov_renewal(draft, target, "token", 1, 2, T)
    np.testing.assert_allclose([calls, T / calls, emitted / calls, naive, palm_lim, naive_lim], EXACT_NUMBERS,
                               rtol=0, atol=1e-12)
    # the per-position average overstates T / E[calls] by 6.3 % (mostly the last call's wasted tokens) and the
    # block efficiency E[emitted] / E[calls] by 2.9 %; in the long-run limit it overstates the Palm mean by 1.7 %
    assert (naive - T / calls) / (T / calls) > 0.06
    assert (naive - emitted / calls) / (emitted / calls) > 0.025
    assert (naive_lim - palm_lim) / palm_lim > 0.015


@pytest.mark.slow  # ~9 s; by default the exact case (p = q: Palm = L + 1, bias 0) runs in test_profile.py
def test_profile_palm_average_and_bias_agree_with_the_exact_markov_renewal(tmp_path):
    # summarize's Palm average (profiled m weighted by the recorded starts) is consistent for
    # E[emitted] / E[calls] of real decoding of T tokens, and its per-position average for the mean of m:
    # both against the exact Markov-renewal values, |z| < 3 (false-failure rate about 0.3 % each, seeds fixed)
    pytest.importorskip("torch")
    pytest.importorskip("pyarrow")
    from otspec.models import MarkovModel

    d, t = prof.toy_pair(4, seed=5, closeness=0.6)

    def markov(lm):  # the bigram CallableLM after the prompt [0], as an exact MarkovModel
        W = np.exp(lm.fn.table - lm.fn.table.max(axis=1, keepdims=True))
        W /= W.sum(axis=1, keepdims=True)
        return MarkovModel(W, initial=[W[0]])

    T, L, n = 8, 2, 60
    prof.profile([[0]] * n, out=tmp_path, draft=d, target=t, k_max=1, L_max=L, max_new_tokens=T,
                 verifiers=["token"], families=["token"], renewal=["token"], shard_size=100, progress=False)
    s = prof.summarize(tmp_path)
    calls, emitted, naive, _, _ = _exact_markov_renewal(markov(d), markov(t), "token", 1, L, T)
    for est, exact in ((s.palm[("token", 1, L)], emitted / calls), (s.tokens_per_call[("token", 1, L)], naive)):
        z = (est.value - exact) / (est.half_width / 1.96)
        assert abs(z) < 3, (est, exact, z)
    b = s.position_bias[("token", 1, L)]
    np.testing.assert_allclose(b.value, s.tokens_per_call[("token", 1, L)].value / s.palm[("token", 1, L)].value - 1,
                               rtol=1e-12)
    z = (b.value - (naive * calls / emitted - 1)) / (b.half_width / 1.96)
    assert abs(z) < 3, (b, naive * calls / emitted - 1, z)


#: exact E[calls for 24 tokens], 24 / E[calls], E[emitted] / E[calls], E[per-position average of m],
#: and the long-run limits: Palm mean of m (tokens per call), stationary per-position mean of m
EXACT_NUMBERS = [11.289353819180283, 2.1258966974021756, 2.195992562973185, 2.2593678067997653, 2.246092645844075,
                 2.284896771651]


# ----------------------------------------------------------------------------- bad input
def test_block_scheme_without_emission_law_is_refused(monkeypatch):
    from otspec import _registry
    from otspec.multidraft import VerifierSpec

    spec = VerifierSpec("x-block", "block", None, BlockVerifyOneStep, single_draft=True)
    monkeypatch.setitem(_registry._REGISTRY, "x-block", spec)
    p = np.array([[0.5, 0.5]] * 3)
    with pytest.raises(ValueError, match="block scheme without emission probabilities"):
        prof.emission_probs("x-block", p, p, np.array([0, 1, 0]))


def test_bad_input():
    p = np.array([[0.5, 0.5]] * 3)
    y = np.array([0, 1, 0])
    with pytest.raises(ValueError, match="`scheme` must be a registered"):
        prof.emission_probs("nope", p, p, y)
    with pytest.raises(TypeError, match="`scheme` must be a registered"):
        prof.emission_probs(3, p, p, y)
    with pytest.raises(ValueError, match="emits L \\+ 1 tokens"):
        prof.emission_probs("block", p, p, y)
    with pytest.raises(ValueError, match="lossy"):
        prof.emission_probs("ensemble", p, p, y)
    with pytest.raises(ValueError, match="i.i.d. draft blocks"):
        prof.emission_probs("top-k", p, p, y, k=2)
    with pytest.raises(ValueError, match="`k` must be 1"):
        prof.emission_probs("token", p, p, y, k=2)
    with pytest.raises(ValueError, match="`method` must be one of"):
        prof.emission_probs("token", p, p, y, method="fast")
    with pytest.raises(ValueError, match="no closed form"):
        prof.emission_probs("lp", p, p, y, k=2, method="closed")
    with pytest.raises(ValueError, match="only the closed form"):
        prof.emission_probs("block-onestep", p, p, y, method="mc")
    with pytest.raises(ValueError, match="`L`=3 needs"):
        prof.emission_probs("token", p, p, y, L=3)
    with pytest.raises(ValueError, match="`y_path` must hold token ids"):
        prof.emission_probs("token", p, p, np.array([0, 2, 0]))
    with pytest.raises(ValueError, match="`y_path` must have shape"):
        prof.emission_probs("token", p, p, np.array([0, 1]))
    with pytest.raises(TypeError, match="`y_path` must be an integer"):
        prof.emission_probs("token", p, p, np.array([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="`q_path`"):
        prof.emission_probs("token", p, p * 2, y)
    e = np.zeros((1, 3, 2))
    with pytest.raises(ValueError, match="`log_q` must have shape"):
        prof.starts_recursion(e, np.zeros((1, 2)))
    with pytest.raises(ValueError, match="`log_q` must be finite"):
        prof.starts_recursion(e, np.full((1, 3), -np.inf))
    with pytest.raises(ValueError, match="`e` must be finite and non-negative"):
        prof.starts_recursion(-np.ones((1, 3, 2)), np.zeros((1, 3)))
    with pytest.raises(ValueError, match="`lengths` must lie in"):
        prof.starts_recursion(e, np.zeros((1, 3)), lengths=[4])
    with pytest.raises(ValueError, match="`e` must have shape \\(n_texts"):
        prof.tokens_per_call(np.zeros((3, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="`m` must be a finite"):
        prof.per_position_tokens_per_call([1.0, 2.0])
    with pytest.raises(ValueError, match="`m` and `r` must be finite"):
        prof.palm_tokens_per_call([[1.0]], [[1.0, 2.0]])
