"""Block verification (``verifier="block"``, Sun et al., arXiv:2403.10444, Algorithm 3 with its continuation) on the
torch route: reading the host on the CPU (``_Decoder._block_on_host``: the numpy route's draws, tokens, model calls
and logged law bit for bit) and on an accelerator (``_Decoder._block_t``, :func:`block_walk_t`: run here on CPU
tensors; its own generator, so its law is checked, by chi-square and against the exact law of the accepted length).

Each chi-square test fails spuriously with probability ALPHA_FAIL = 1e-4; this file holds 5 of them (the slow ones
included), so its false-failure rate stays below 1e-3; the seeds are fixed, so a run is reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.block  # noqa: E402
import otspec.decoding as D  # noqa: E402
import otspec.models  # noqa: E402
from otspec.block._verifiers import backward_law  # noqa: E402
from otspec.decoding import _loop  # noqa: E402
from otspec.decoding._verifiers import block_walk_t  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from tests.test_decoding_last_iteration import _joint_counts  # noqa: E402
from tests.toy_lm import tiny_llama, toy_target_draft  # noqa: E402

torch.set_num_threads(1)
ALPHA_FAIL = 1e-4
SAMPLINGS = [dict(), dict(temperature=0.7, top_k=5), dict(top_p=0.9), dict(top_p=0.8, top_p_rule="transformers"),
             dict(temperature=0.0)]
EXACT = ("tokens", "accepted", "emitted", "target_calls", "draft_lengths", "predicted_accepted", "predicted_emitted",
         "predicted_calls", "predicted_reached", "reached", "alpha_first")


def _decode(route, monkeypatch, **kw):
    """``verifier="block"`` on the route ``route``: ``"numpy"``, ``"host"`` (the torch route on the CPU) or
    ``"device"`` (the accelerator's route on CPU tensors)."""
    monkeypatch.setattr(_loop._Decoder, "read_on_host", False if route == "device" else None)
    return D.speculative_decode(**kw, verifier="block", engine="numpy" if route == "numpy" else "torch")


def _pairs():
    return [toy_target_draft(7, seed=3), (tiny_llama(1, vocab=40), tiny_llama(2, vocab=40))]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "plain")
def test_host_route_equals_the_numpy_route(sampling, monkeypatch):
    """Whole decodes of a toy table pair and a tiny Llama pair (``L`` = 1, 2, 4, two seeds, the last iterations
    shortened): the torch route on the CPU makes the numpy route's tokens, accepted lengths, emitted tokens, target
    and draft calls, and logged predictions (the law of the accepted length, the predicted calls, alpha_1) bit for
    bit; ``alpha_opt_first`` is alpha_1 there, the numpy route's :func:`otspec.alpha_k` on the renormalised support
    to 1e-12. The iterations met include every draft accepted, none, some, and (but greedy) a continuation that
    needs model calls."""
    seen = set()
    for target, draft in _pairs():
        for L in (1, 2, 4):
            for seed in range(2):
                kw = dict(prompt=[1, 2, 3], draft=draft, target=target, L=L, max_new_tokens=11, rng=seed, **sampling)
                ref, host = _decode("numpy", monkeypatch, **kw), _decode("host", monkeypatch, **kw)
                assert (ref.engine, host.engine) == ("numpy", "torch")
                for f in EXACT:
                    np.testing.assert_array_equal(getattr(host, f), getattr(ref, f), err_msg=f)
                assert (host.draft_calls, host.total_target_calls) == (ref.draft_calls, ref.total_target_calls)
                np.testing.assert_allclose(host.alpha_opt_first, ref.alpha_opt_first, rtol=0, atol=1e-12)
                n = host.draft_lengths
                seen |= {"all" if a == m else "none" if a == 0 else "some"
                         for a, m in zip(host.accepted[n > 0], n[n > 0], strict=True)}
                seen |= {"calls"} if (host.target_calls > 1).any() else set()
    assert seen >= {"all", "none", "calls"} and (seen >= {"some"} or sampling.get("temperature") == 0.0)


@pytest.mark.parametrize("L", [1, 2, 4])
def test_device_route_greedy_equals_the_numpy_route(L, monkeypatch):
    """Greedy decoding leaves nothing to chance: the accelerator's route (its own generator) makes the numpy
    route's tokens and accepted lengths, and logs the same predictions (to 1e-12); its target calls are
    :math:`1 + L - \\tau` every iteration (the continuation is called whether or not it meets the block again)."""
    for target, draft in _pairs():
        kw = dict(prompt=[1, 2, 3], draft=draft, target=target, L=L, max_new_tokens=11, rng=0, temperature=0.0)
        ref, dev = _decode("numpy", monkeypatch, **kw), _decode("device", monkeypatch, **kw)
        np.testing.assert_array_equal(dev.tokens, ref.tokens)
        np.testing.assert_array_equal(dev.accepted, ref.accepted)
        for f in ("predicted_accepted", "predicted_calls", "predicted_reached", "alpha_first", "alpha_opt_first"):
            np.testing.assert_allclose(getattr(dev, f), getattr(ref, f), rtol=0, atol=1e-12, err_msg=f)
        n = dev.draft_lengths
        np.testing.assert_array_equal(dev.target_calls[n > 0], 1 + n[n > 0] - dev.accepted[n > 0])


def test_host_route_forms_its_laws_in_place_and_validates_none(monkeypatch):
    """The host route forms every law once, into kept blocks (:func:`_loop._laws_into`): per iteration its ``L``
    draft and ``L`` target laws, one per continuation call, and the target's bonus law only where the output
    followed the block (no continuation call; one row for plain decoding's step) -- and never copies or validates
    a law through :func:`otspec.models.next_law`. The numpy route before this change formed none there (``feed``
    and :func:`next_law` on every law)."""
    target, draft = toy_target_draft(6, seed=0)
    rows, validated = [], []
    real, real_next = _loop._laws_into, otspec.models.next_law

    def counting(sampling, logits, out):
        rows.append(math.prod(out.shape[:-1]))
        return real(sampling, logits, out)

    monkeypatch.setattr(_loop, "_laws_into", counting)
    monkeypatch.setattr("otspec.block._verifiers.next_law", lambda *a: validated.append(1) or real_next(*a))
    res = _decode("host", monkeypatch, prompt=[0], draft=draft, target=target, L=3, max_new_tokens=40, rng=5)
    n, calls = res.draft_lengths, res.target_calls
    assert (calls > 1).any() and (calls[n > 0] == 1).any() and len(n) > 5  # both kinds of iteration occur
    assert not validated
    assert sum(rows) == res.draft_calls + int((n + (calls == 1) + calls - 1)[n > 0].sum()) + int((n == 0).sum())


def _continuation_with_bad_logits(role: str):
    """``(draft, target)`` on 5 tokens: the draft proposes token 0, which the target gives no mass (every block is
    rejected at its first token, and the output continues with another token); the ``role`` model's logits are
    ``+inf`` at one entry of its law after 3 tokens when the third is not 0 -- a law only the continuation asks
    for (the prompt has 2 tokens)."""
    V = 5
    draft_table = torch.full((V,), -50.0, dtype=torch.float64)
    draft_table[0] = 10.0
    target_table = torch.zeros(V, dtype=torch.float64)
    target_table[0] = -math.inf

    def fn(table, broken):
        def f(ids):
            out = table.expand(*ids.shape, V).clone()
            if broken and ids.shape[1] >= 3:
                out[:, 2, 2] = torch.where(ids[:, 2] != 0, math.inf, out[:, 2, 2])
            return out
        return f

    return (D.CallableLM(fn(draft_table, role == "draft"), V, name="draft"),
            D.CallableLM(fn(target_table, role == "target"), V, name="target"))


@pytest.mark.parametrize("role", ["draft", "target"])
@pytest.mark.parametrize("route", ["host", "device"])
def test_non_finite_logits_of_a_continuation_call_are_refused(route, role, monkeypatch):
    """Non-finite logits in a law that only block verification's continuation asks for (its extra model calls)
    are refused with the model and the position, on both routes."""
    draft, target = _continuation_with_bad_logits(role)
    with pytest.raises(ValueError, match=rf"the {role} model '{role}' gave non-finite logits .* position 3 .*"
                                         r"continuation"):
        _decode(route, monkeypatch, prompt=[1, 1], draft=draft, target=target, L=3, max_new_tokens=8, rng=0)


def test_device_route_synchronises_once_plus_once_for_a_continuation(monkeypatch):
    """The accelerator's route reads the device once per iteration, and once more when the output continues past
    a rejection (:math:`\\tau < L`): counted at every way a tensor reaches the host (``tolist``, ``item``, and
    ``bool``/``int``/``float`` of a tensor), on a pair of table models (no host read of their own)."""
    target, draft = toy_target_draft(6, seed=0)
    reads = []
    for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, (lambda r: lambda self, *a: reads.append(1) or r(self, *a))(real))
    res = _decode("device", monkeypatch, prompt=[0], draft=draft, target=target, L=3, max_new_tokens=40, rng=5)
    n = res.draft_lengths
    assert (res.accepted[n > 0] < n[n > 0]).any() and (res.accepted[n > 0] == n[n > 0]).any()
    seed_draw = 1  # the seed of the run's generators, drawn from `rng` once
    assert len(reads) == seed_draw + int((1 + (res.accepted < n))[n > 0].sum()) + int((n == 0).sum())


@pytest.mark.parametrize("L", [1, 2, 4])
def test_block_walk_t_law_is_the_exact_law_of_tau(L):
    """:func:`block_walk_t` on random rows: the law of the accepted length from its logged numbers equals
    :func:`otspec.block.tau_law_on_path` (the numpy route's exact law) to 1e-12."""
    g = np.random.default_rng(L)
    V = 9
    for _ in range(20):
        P, Q = g.dirichlet(np.full(V, 0.5), size=L), g.dirichlet(np.full(V, 0.5), size=L + 1)
        x = [int(g.choice(V, p=P[i])) for i in range(L)]
        _, _, w, sums = block_walk_t(torch.tensor(x), torch.from_numpy(P), torch.from_numpy(Q),
                                     torch.Generator().manual_seed(0))
        got = backward_law(float(w[L]), [tuple(s) for s in sums.tolist()])
        np.testing.assert_allclose(got, otspec.block.tau_law_on_path("block", x, P, Q), rtol=0, atol=1e-12)


def test_block_walk_t_draws_tau_and_the_next_token_from_their_law():
    """The joint law of :math:`\\tau` and the output's next token (the bonus at :math:`\\tau = L`, the first
    residual token otherwise) drawn by :func:`block_walk_t` against the exact law: :math:`P(\\tau = t \\mid X)`
    times the normalised :math:`(w_t q_{t+1} - p_{t+1})_+` (:math:`q_{L+1}` at :math:`t = L`); chi-square over
    4,000 draws."""
    g = np.random.default_rng(7)
    L, V = 3, 4
    P, Q = g.dirichlet(np.full(V, 1.0), size=L), g.dirichlet(np.full(V, 1.0), size=L + 1)
    x = [1, 2, 0]
    law_tau = otspec.block.tau_law_on_path("block", x, P, Q)
    w = np.concatenate([[1.0], np.cumprod(Q[np.arange(L), x] / P[np.arange(L), x])])
    joint = np.zeros((L + 1, V))
    for t in range(L + 1):
        r = Q[L] if t == L else np.maximum(w[t] * Q[t] - P[t], 0.0)
        joint[t] = law_tau[t] * r / r.sum()
    gen = torch.Generator().manual_seed(11)
    xt, Pt, Qt = torch.tensor(x), torch.from_numpy(P), torch.from_numpy(Q)
    counts = np.zeros((L + 1, V), dtype=np.int64)
    for _ in range(4000):
        tau, y, _, _ = block_walk_t(xt, Pt, Qt, gen)
        counts[int(tau), int(y)] += 1
    keep = joint.ravel() > 0
    assert counts.ravel()[~keep].sum() == 0
    assert chi2_gof(counts.ravel()[keep], joint.ravel()[keep], alpha_fail=ALPHA_FAIL).passed


@pytest.mark.parametrize("route", ["host", "device"])
def test_joint_law_of_one_iteration(route, monkeypatch):
    """``L = 2``, 3 tokens (one whole iteration: the accepted tokens, the continuation with its model calls, the
    bonus): their joint law is the target's (chi-square, 27 cells)."""
    monkeypatch.setattr(_loop._Decoder, "read_on_host", False if route == "device" else None)
    target, draft = toy_target_draft(3, seed=0, named=True)
    counts, law, met = _joint_counts(target, draft, 3, 600, verifier="block", L=2, engine="torch")
    assert met == {2}
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, g


@pytest.mark.slow
@pytest.mark.parametrize("route", ["host", "device"])
def test_joint_law_with_shortened_iterations(route, monkeypatch):
    """``L = 3``, 5 tokens: a whole iteration (4 tokens), then plain decoding's step; their joint law is the
    target's (chi-square, 243 cells, 6,000 runs)."""
    monkeypatch.setattr(_loop._Decoder, "read_on_host", False if route == "device" else None)
    target, draft = toy_target_draft(3, seed=0, named=True)
    counts, law, met = _joint_counts(target, draft, 5, 6000, verifier="block", L=3, engine="torch")
    assert met == {0, 3}
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, g
