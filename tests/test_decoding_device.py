"""The decoder's device route (``engine="torch"``) against the numpy route and the exact laws.

Chi-square tests fail spuriously with probability ALPHA_FAIL = 1e-4 each (5 in this file); seeds are
fixed, so a run is reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import otspec  # noqa: E402
import otspec.decoding as D  # noqa: E402
from otspec.decoding import _loop  # noqa: E402
from otspec.decoding._sampling import bad_rows, draw_rows  # noqa: E402
from otspec.decoding._verifiers import step_law_t, verify_chain_t  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from tests.toy_lm import toy_target_draft  # noqa: E402

torch.set_num_threads(1)
ALPHA_FAIL = 1e-4


def _law(rng, n, holes=0.3):
    x = rng.random(n) * (rng.random(n) >= holes)
    x[rng.integers(n)] += 0.2
    return x / x.sum()


def _memoryless(n, seed=0, scale=2.0, noise=0.6, name="mem"):
    """Logits that depend on the last token only: the laws after any context are rows of two tables."""
    g = torch.Generator().manual_seed(seed)
    tq = torch.randn(n, n, generator=g, dtype=torch.float64) * scale
    tp = tq + noise * torch.randn(n, n, generator=g, dtype=torch.float64)
    return (D.CallableLM(lambda ids: tq[ids], n, name=f"{name}-target"),
            D.CallableLM(lambda ids: tp[ids], n, name=f"{name}-draft"), tq, tp)


# ----------------------------------------------------------------------------- one depth: the law
def test_device_step_law_equals_the_numpy_verifiers():
    """The device rule's law given its drafts (from the round targets the sampler uses) is
    MultiRound.conditional (and MaximalCoupling.conditional at k = 1), the numpy route, to 1e-12."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n, k = int(rng.integers(2, 12)), int(rng.integers(1, 5))
        p, q = _law(rng, n), _law(rng, n)
        if rng.random() < 0.2:
            q = p.copy()  # no residual mass: the guarded residual
        xs = [int(x) for x in rng.choice(n, k, p=p)]
        got = step_law_t(torch.from_numpy(p), torch.from_numpy(q), xs).numpy()
        np.testing.assert_allclose(got, otspec.multidraft.multiround(p, q, k).conditional(xs), rtol=0, atol=1e-12)
        if k == 1:
            np.testing.assert_allclose(got, otspec.maximal_coupling(p, q).conditional(xs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", ["race", "cdf"])
def test_draw_rows_follows_the_weights(rule):
    """Both draw rules against W / sum W by chi-square; zero-weight entries are never drawn."""
    W = torch.tensor([[0.0, 3.0, 0.0, 1.0, 2.0, 0.0, 4.0, 0.0]], dtype=torch.float64) * 0.37
    g = torch.Generator().manual_seed(5)
    ids = torch.cat([draw_rows(W.expand(2000, -1), g, rule=rule) for _ in range(3)]).numpy()
    counts = np.bincount(ids, minlength=8)
    law = (W[0] / W.sum()).numpy()
    assert counts[law == 0].sum() == 0
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed
    with pytest.raises(ValueError, match="rule"):
        draw_rows(W, g, rule="gumbel")


@pytest.mark.parametrize("K", [1, 3])
def test_verify_chain_first_depth_follows_its_law(K):
    """The device verification's first output, fixed drafts, against step_law_t (chi-square)."""
    rng = np.random.default_rng(2)
    n, L = 6, 2
    P = torch.from_numpy(np.stack([[_law(rng, n) for _ in range(L)]] * K))
    Q = torch.from_numpy(np.stack([[_law(rng, n) for _ in range(L + 1)]] * K))
    X = torch.tensor([[int(rng.choice(n, p=P[0, 0].numpy())), 1] for _ in range(K)])
    g = torch.Generator().manual_seed(9)
    counts = np.zeros(n, dtype=np.int64)
    for _ in range(3000):
        out, tau, row, alpha = verify_chain_t(X, P, Q, g)
        counts[int(out[0])] += 1
    law = step_law_t(P[0, 0], Q[0, 0], X[:, 0].tolist()).numpy()
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed
    exact = otspec.multidraft.multiround(P[0, 0].numpy(), Q[0, 0].numpy(), K).acceptance()
    np.testing.assert_allclose(float(alpha[0]), exact, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- the loop
@pytest.mark.parametrize("verifier,K", [("token", 1), ("multiround", 3)])
def test_device_route_predictions_are_the_exact_values(verifier, K):
    """alpha_first is the verifier's exact acceptance on the laws after each iteration's context (computed
    here from the models' tables with the numpy route), alpha_opt_first is alpha_K, to 1e-12."""
    n = 30
    target, draft, tq, tp = _memoryless(n, seed=4)
    res = D.speculative_decode([0], draft=draft, target=target, verifier=verifier, k=K, L=3, max_new_tokens=40,
                               rng=3)
    assert res.engine == "torch" and res.lossless
    ctx = [0] + res.tokens.tolist()
    starts = np.concatenate([[0], np.cumsum(res.emitted)[:-1]])
    for i, s in enumerate(starts):
        if res.draft_lengths[i] == 0:  # the last iteration's plain step (one token left): nothing verified
            assert np.isnan(res.alpha_first[i]) and np.isnan(res.alpha_opt_first[i])
            continue
        last = ctx[s]
        p = torch.softmax(tp[last], -1).numpy()
        q = torch.softmax(tq[last], -1).numpy()
        v = otspec.multidraft.multiround(p, q, K)
        np.testing.assert_allclose(res.alpha_first[i], v.acceptance(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(res.alpha_opt_first[i], otspec.alpha_k(p, q, K), rtol=0, atol=1e-12)
    drafted = res.draft_lengths > 0
    np.testing.assert_allclose(res.predicted_reached[drafted, 0], res.alpha_first[drafted], rtol=0, atol=0)
    np.testing.assert_allclose(res.predicted_accepted, res.predicted_reached.sum(axis=1), rtol=1e-12)
    if K > 1:
        quiet = D.speculative_decode([0], draft=draft, target=target, verifier=verifier, k=K, L=3,
                                     max_new_tokens=40, rng=3, log_laws=False)
        np.testing.assert_array_equal(quiet.tokens, res.tokens)
        assert np.isnan(quiet.alpha_opt_first).all()


def test_device_and_numpy_routes_agree_on_acceptance():
    """Both routes' measured acceptance against their own exact predictions (martingale z-scores)."""
    target, draft = toy_target_draft(5, seed=0)
    for engine in ("torch", "numpy"):
        runs = [D.speculative_decode([1, 2], draft=draft, target=target, L=3, max_new_tokens=60, rng=s,
                                     engine=engine) for s in range(8)]
        assert {r.engine for r in runs} == {engine}
        assert abs(D.summarize(runs).z_accepted) < 4.0


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts every call that reads a tensor on the host (the synchronisations of a CUDA run)."""

    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.numpy,
             torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


class _ScalarReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense``: every tensor turned into a Python number, also inside C++ (a 0-dim
    tensor used as an index or as a Scalar argument), each a synchronisation on a GPU."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("verifier,K", [("token", 1), ("multiround", 2), ("block-onestep", 1)])
def test_device_route_reads_the_host_once_per_iteration(verifier, K, monkeypatch):
    """One host read per iteration (the emitted tokens), plus the seed before the loop and the logged
    acceptances after it, and no tensor turned into a number anywhere else (counted at the dispatcher,
    where a hidden ``.item()`` would show); the numpy route reads far more. The route an accelerator runs
    (``read_on_host=False``; on the CPU speculative sampling reads its few numbers on the host)."""
    monkeypatch.setattr(_loop._Decoder, "read_on_host", False)
    target, draft, _, _ = _memoryless(40, seed=1)
    kw = dict(draft=draft, target=target, verifier=verifier, k=K, L=3, max_new_tokens=30, rng=0)
    with _HostReads() as mode, _ScalarReads() as scalars:
        res = D.speculative_decode([0], **kw, log_laws=False)
    assert mode.reads.count("tolist") == res.iterations
    assert len(mode.reads) == res.iterations + 2, mode.reads
    assert scalars.reads == 1  # the seed, drawn once from rng before the loop
    with _HostReads() as mode:
        host = D.speculative_decode([0], **kw, engine="numpy")
    assert len(mode.reads) > 2 * host.iterations


def test_engine_bad_input_before_any_model_call():
    target, draft, _, _ = _memoryless(8)
    for kw, match in [({"engine": "cuda"}, "`engine`"), ({"engine": "torch", "verifier": "kseq", "k": 2},
                                                         "engine`='torch'"),
                      ({"log_laws": 1}, "log_laws")]:
        with pytest.raises((ValueError, TypeError), match=match):
            D.speculative_decode([0], draft=_Refuse(draft), target=_Refuse(target), **kw)


class _Refuse:
    """A LanguageModel that fails the test if called."""

    def __init__(self, lm):
        self.vocab_size, self.device, self.name = lm.vocab_size, lm.device, lm.name

    def new_state(self):
        raise AssertionError("a model was called")

    def logits(self, state, ids):
        raise AssertionError("a model was called")

    def select(self, state, row, length):
        raise AssertionError("a model was called")


def test_law_memory_is_checked_before_any_model_call(monkeypatch):
    target, draft, _, _ = _memoryless(8)
    assert _loop.law_bytes(8, 3, 4) == 8 * 8 * 3 * 9
    monkeypatch.setattr(_loop, "MAX_LAW_BYTES", _loop.law_bytes(8, 3, 4) - 1)
    with pytest.raises(ValueError, match=r"8 \* V \* k \* \(2L \+ 1\).*V=8, k=3, L=4.*MAX_LAW_BYTES"):
        D.speculative_decode([0], draft=_Refuse(draft), target=_Refuse(target), verifier="multiround", k=3, L=4)
    D.speculative_decode([0], draft=draft, target=target, verifier="multiround", k=3, L=3, max_new_tokens=4)


@pytest.mark.parametrize("role,bad_at", [("target", 5), ("draft", 4)])
@pytest.mark.parametrize("engine", ["torch"])
def test_non_finite_logits_name_the_model_and_the_position(role, bad_at, engine):
    """float16 logits that overflow (+inf) after ``bad_at`` tokens: a ValueError naming the model and the
    position, not a silent garbage token."""
    n = 6
    g = torch.Generator().manual_seed(0)
    table = torch.randn(n, n, generator=g).to(torch.float16)

    def fn(ids):
        out = table[ids].clone()
        if ids.shape[1] >= bad_at:
            out[:, bad_at - 1, 2] = math.inf
        return out

    ok = D.CallableLM(lambda ids: table[ids], n, name="fine")
    broken = D.CallableLM(fn, n, name="overflowing-fp16")
    pair = dict(target=broken, draft=ok) if role == "target" else dict(target=ok, draft=broken)
    with pytest.raises(ValueError, match=rf"the {role} model 'overflowing-fp16' gave non-finite logits .* "
                                         rf"position {bad_at}"):
        D.speculative_decode([0, 1], **pair, L=3, max_new_tokens=20, rng=0, engine=engine)


def test_bad_rows_marks_every_processing_rule():
    """Sampling.probs(check=False) turns NaN / +inf / all -inf rows into NaN rows under every rule, so one
    entry per row tells them apart; a row with some -inf logits stays a law."""
    L = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, math.nan, 1.0, 2.0], [0.0, math.inf, 1.0, 2.0],
                      [-math.inf] * 4, [0.0, -math.inf, 1.0, 2.0]])
    for s in (D.Sampling(), D.Sampling(temperature=0.7), D.Sampling(top_k=2), D.Sampling(top_p=0.5),
              D.Sampling(top_p=0.5, top_p_rule="transformers"), D.Sampling(temperature=0)):
        assert bad_rows(s.probs(L, check=False)).tolist() == [False, True, True, True, False], s
    np.testing.assert_array_equal(D.Sampling().probs(L[[0, 4]], check=False).numpy(),
                                  D.Sampling().probs(L[[0, 4]]).numpy())


# ----------------------------------------------------------------------------- one-step block verification
def test_block_onestep_tau_law_equals_the_numpy_route():
    """P(tau = t | X) of the device rule equals otspec.block.tau_law_on_path to 1e-12 (drafts equal to the
    target along the block included: every h_i = 1)."""
    from otspec.decoding._verifiers import block_onestep_tau_law_t

    rng = np.random.default_rng(1)
    for _ in range(300):
        n, L = int(rng.integers(2, 9)), int(rng.integers(1, 6))
        P = np.stack([_law(rng, n) for _ in range(L)])
        Q = np.stack([_law(rng, n) for _ in range(L + 1)])
        if rng.random() < 0.2:
            Q[:L] = P
        x = [int(rng.choice(n, p=P[i])) for i in range(L)]
        got = block_onestep_tau_law_t(torch.tensor(x), torch.from_numpy(P), torch.from_numpy(Q))[0].numpy()
        want = otspec.block.tau_law_on_path("block-onestep", x, list(P), list(Q))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_block_onestep_draws_follow_the_exact_law():
    """(tau, emitted token) of the device rule on a fixed block against the exact joint law, built here in
    numpy: P(tau = t | X) times the normalised (w_t q_{t+1} - p_{t+1})_+ (q_{L+1} at t = L)."""
    from otspec.decoding._verifiers import verify_block_onestep_t

    rng = np.random.default_rng(3)
    n, L = 4, 2
    P = np.stack([_law(rng, n, holes=0) for _ in range(L)])
    Q = np.stack([_law(rng, n, holes=0) for _ in range(L + 1)])
    x = [int(np.argmax(P[0])), int(np.argmax(P[1] - Q[1]))]
    tau_law = otspec.block.tau_law_on_path("block-onestep", x, list(P), list(Q))
    w = [1.0]
    for i in range(L):
        w.append(min(1.0, w[-1] * Q[i, x[i]] / P[i, x[i]]))
    joint = np.zeros((L + 1, n))
    for t in range(L + 1):
        r = Q[L] if t == L else np.maximum(w[t] * Q[t] - P[t], 0.0)
        joint[t] = tau_law[t] * r / r.sum()
    g = torch.Generator().manual_seed(4)
    args = torch.tensor([x]), torch.from_numpy(P[None]), torch.from_numpy(Q[None])
    counts = np.zeros((L + 1, n), dtype=np.int64)
    for _ in range(4000):
        out, tau, _, law = verify_block_onestep_t(*args, g)
        counts[int(tau), int(out[int(tau)])] += 1
    np.testing.assert_allclose(law.numpy(), tau_law, rtol=0, atol=1e-12)
    keep = joint.ravel() > 0
    assert counts.ravel()[~keep].sum() == 0
    assert chi2_gof(counts.ravel()[keep], joint.ravel()[keep], alpha_fail=ALPHA_FAIL).passed


def test_device_generators_one_per_device():
    """One generator when draft and target share a device (however it is spelled), seeded from rng."""
    gd, gt = _loop._device_generators(7, "cpu", torch.device("cpu"))
    assert gd is gt and gt.initial_seed() == 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("verifier,K", [("token", 1), ("multiround", 2), ("block-onestep", 1)])
def test_device_route_on_cuda_is_reproducible_with_one_read_per_iteration(verifier, K):
    """On a GPU (run wherever one is at hand): the device route, the draft on the CPU or the GPU, reproducible
    from its seed, one host read per iteration and no hidden scalar read."""
    n = 64
    g = torch.Generator().manual_seed(0)
    tq = torch.randn(n, n, generator=g, dtype=torch.float64).cuda()
    tp_cpu = (tq.cpu() + 0.5 * torch.randn(n, n, generator=g, dtype=torch.float64))
    target = D.CallableLM(lambda ids: tq[ids], n, device="cuda", name="t")
    for draft in (D.CallableLM(lambda ids: tp_cpu.cuda()[ids], n, device="cuda", name="d"),
                  D.CallableLM(lambda ids: tp_cpu[ids], n, device="cpu", name="d-cpu")):
        kw = dict(draft=draft, target=target, verifier=verifier, k=K, L=3, max_new_tokens=24, rng=1, log_laws=False)
        a = D.speculative_decode([0], **kw)
        with _ScalarReads() as scalars:
            b = D.speculative_decode([0], **kw)
        assert a.engine == "torch"
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert scalars.reads == 1


def test_laws_are_written_into_the_reused_block_bit_for_bit():
    """The device route's laws go straight into one block per decode (no fresh 8 V-byte row and copy each time):
    the same values as Sampling.probs bit for bit, for the plain law (the softmax writing into the block) and the
    others (computed, then copied); the block is reused while its shape and device hold."""
    from otspec.decoding._loop import _law_block, _laws_into

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 50, generator=g) * 4
    block = _law_block(None, (2, 3, 50), "cpu")
    assert _law_block(block, (2, 3, 50), "cpu") is block
    assert _law_block(block, (1, 3, 50), "cpu") is not block
    for s in (D.Sampling(), D.Sampling(temperature=0.7), D.Sampling(top_k=5), D.Sampling(top_p=0.8),
              D.Sampling(temperature=0.0)):
        got = _laws_into(s, logits, block)
        assert got.data_ptr() == block.data_ptr()
        assert torch.equal(block, s.probs(logits, check=False)), s
        row = _laws_into(s, logits[:, -1], block[:, 1])  # a strided view of the block
        assert row.data_ptr() == block[:, 1].data_ptr() and torch.equal(block[:, 1], s.probs(logits[:, -1]))
