"""Speculative sampling's verification reading the host on the CPU (``_Decoder._chain_on_host``): the target's
laws formed only as far as the chain goes, the same draws as the accelerator's route."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.decoding as D  # noqa: E402
from otspec.decoding import _loop, _tree_device  # noqa: E402
from otspec.decoding._sampling import MIN_TEMPERATURE, bad_logit_rows, bad_rows  # noqa: E402
from tests.toy_lm import tiny_llama, toy_target_draft  # noqa: E402

SAMPLINGS = [dict(), dict(temperature=0.7, top_k=5), dict(top_p=0.9), dict(top_p=0.8, top_p_rule="transformers"),
             dict(temperature=0.0)]


def decode_counting_laws(monkeypatch, **kw):
    """A decode on the host route of a toy pair (seed 5, 40 tokens) and the number of law rows formed by each call
    of the one function that forms them (``_loop._laws_into``)."""
    target, draft = toy_target_draft(6, seed=0)
    rows = []
    real = _loop._laws_into

    def counting(sampling, logits, out):
        rows.append(math.prod(out.shape[:-1]))
        return real(sampling, logits, out)

    monkeypatch.setattr(_loop, "_laws_into", counting)
    return _decode(None, monkeypatch, prompt=[0], draft=draft, target=target, max_new_tokens=40, rng=5, **kw), rows


def decodes_on_both_routes(monkeypatch, decode, Ls, sampling):
    """Whole decodes of a toy table pair and a tiny Llama pair at each ``L`` of ``Ls`` and two seeds, on the
    accelerator's route and the host route (``decode(route, monkeypatch, **kw)``), their tokens, acceptances and
    draft lengths checked equal bit for bit; yields each ``(device route, host route)`` pair of results."""
    pairs = [toy_target_draft(7, seed=3), (tiny_llama(1, vocab=40), tiny_llama(2, vocab=40))]
    for (target, draft) in pairs:
        for L in Ls:
            for seed in range(2):
                kw = dict(prompt=[1, 2, 3], draft=draft, target=target, L=L, max_new_tokens=11, rng=seed,
                          **sampling)
                dev, host = decode(False, monkeypatch, **kw), decode(None, monkeypatch, **kw)
                np.testing.assert_array_equal(host.tokens, dev.tokens)
                np.testing.assert_array_equal(host.accepted, dev.accepted)
                np.testing.assert_array_equal(host.draft_lengths, dev.draft_lengths)
                yield dev, host


def rejected_pair_with_bad_logits(bad_at: int):
    """``(draft, target)`` on 5 tokens: the draft proposes token 0, which the target gives no mass (every draft is
    rejected), and the target's logits are ``+inf`` at one entry of its law after ``bad_at`` tokens."""
    V = 5
    draft_table = torch.full((V,), -50.0, dtype=torch.float64)
    draft_table[0] = 10.0
    target_table = torch.zeros(V, dtype=torch.float64)
    target_table[0] = -math.inf

    def target_fn(ids):
        out = target_table.expand(*ids.shape, V).clone()
        if ids.shape[1] >= bad_at:
            out[:, bad_at - 1, 2] = math.inf
        return out

    draft = D.CallableLM(lambda ids: draft_table.expand(*ids.shape, V).clone(), V, name="draft")
    return draft, D.CallableLM(target_fn, V, name="broken-target")


def _decode(route, monkeypatch, **kw):
    monkeypatch.setattr(_loop._Decoder, "read_on_host", route)
    return D.speculative_decode(**kw, engine="torch")


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "plain")
def test_host_route_equals_the_accelerators_route(sampling, monkeypatch):
    """Whole decodes, both routes on the same CPU tensors (L = 1 and 4, two seeds): the same tokens, acceptances
    and draft lengths bit for bit (the same uniforms, products and residual rows), and the same logged predictions
    (the depths reached: the same sums of minima, formed on fewer rows; to 1e-14)."""
    for dev, host in decodes_on_both_routes(monkeypatch, _decode, (1, 4), sampling):
        for f in ("predicted_accepted", "predicted_emitted"):
            np.testing.assert_allclose(getattr(host, f), getattr(dev, f), rtol=1e-14, atol=1e-15)


def test_host_route_forms_the_target_rows_up_to_the_first_rejection(monkeypatch):
    """Every iteration forms its ``L`` draft laws and ``tau + 1`` target laws (``L + 1`` when every draft is
    accepted), not ``L + 1`` target laws whatever ``tau``: counted at the one function that forms them. The
    route before this change formed ``L + 1`` target rows per iteration."""
    res, rows = decode_counting_laws(monkeypatch, L=4)
    drafted = res.draft_lengths[res.draft_lengths > 0]
    taus = res.accepted[res.draft_lengths > 0]
    assert (taus < drafted).any() and len(drafted) > 5  # rejections happen: the test can tell the routes apart
    assert sum(rows) == int(drafted.sum() + (taus + 1).sum())


def test_logits_past_the_first_rejection_are_still_refused(monkeypatch):
    """A non-finite logit at a depth after the first rejection (a law the host route never forms) is refused with
    the model and the position, as on the accelerator's route: the draft proposes token 0, which the target gives
    no mass, so every chain stops at its first depth."""
    draft, target = rejected_pair_with_bad_logits(4)
    for route in (None, False):
        with pytest.raises(ValueError, match=r"the target model 'broken-target' gave non-finite logits .* position 4"):
            _decode(route, monkeypatch, prompt=[1, 1], draft=draft, target=target, L=3, max_new_tokens=8, rng=0)


@pytest.mark.parametrize("sampling", [D.Sampling(), D.Sampling(temperature=0.5), D.Sampling(temperature=2.0, top_k=2),
                                      D.Sampling(top_p=0.7), D.Sampling(top_p=0.7, top_p_rule="transformers"),
                                      D.Sampling(temperature=0.0), D.Sampling(temperature=MIN_TEMPERATURE, top_k=3)])
def test_bad_logit_rows_is_the_rule_of_bad_rows(sampling):
    """The check of the rows whose law is never formed marks exactly the rows :meth:`Sampling.probs` makes NaN:
    NaN or +inf logits, no finite logit, a finite logit that the temperature sends past the largest float."""
    inf, nan = math.inf, math.nan
    L = torch.tensor([[0.0, 1.0, 2.0, -1.0], [0.0, nan, 1.0, 0.0], [0.0, inf, 1.0, 0.0], [-inf, -inf, -inf, -inf],
                      [-inf, 0.5, -inf, -inf], [3e38, 1.0, 0.0, -1.0], [-3e38, -3e38, -inf, -3e38],
                      [nan, nan, nan, nan]], dtype=torch.float32)
    assert bad_logit_rows(sampling, L).tolist() == bad_rows(sampling.probs(L, check=False)).tolist()
    # float64 logits: one the smallest temperature (Sampling refuses a smaller one) sends past the largest float
    L64 = L.double()
    L64[5, 0] = 1e300
    assert bad_logit_rows(sampling, L64).tolist() == bad_rows(sampling.probs(L64, check=False)).tolist()


@pytest.mark.skipif(not _tree_device._PASSES_COMPILED, reason="the numba passes are off (no numba, or no fused addcmul)")
@pytest.mark.parametrize("verifier", ["token", "block-onestep"])
def test_host_route_draws_without_writing_running_sums(verifier, monkeypatch):
    """On the host route the drafts and the residual are drawn by the numba pass that reads each row once
    (``_loop._draw_rows_on``): no ``torch.cumsum`` row is written in a whole decode (the route before wrote one per
    draw), while the accelerator's route on the same CPU tensors still draws through ``draw_rows``; the tokens of
    both routes are compared bit for bit by ``test_host_route_equals_the_accelerators_route``."""
    target, draft = toy_target_draft(6, seed=0)
    calls = []
    real = torch.cumsum

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(torch, "cumsum", counting)
    kw = dict(prompt=[0], draft=draft, target=target, L=4, max_new_tokens=30, rng=2, verifier=verifier)
    host = _decode(None, monkeypatch, **kw)
    assert not calls and host.iterations > 3
    dev = _decode(False, monkeypatch, **kw)
    assert calls
    np.testing.assert_array_equal(host.tokens, dev.tokens)
