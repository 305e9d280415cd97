"""One-step block verification reading the host on the CPU (``_Decoder._block_onestep_on_host``): the weights,
the law of the accepted length and its draw in Python floats, the target's bonus law formed only when every draft
is accepted; the same draws, laws and logged predictions as the accelerator's route (:func:`verify_block_onestep_t`)
bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.decoding as D  # noqa: E402
from otspec.decoding import _loop  # noqa: E402
from tests.test_decoding_chain_host import (  # noqa: E402
    decode_counting_laws,
    decodes_on_both_routes,
    rejected_pair_with_bad_logits,
)

SAMPLINGS = [dict(), dict(temperature=0.7, top_k=5), dict(top_p=0.9), dict(top_p=0.8, top_p_rule="transformers"),
             dict(temperature=0.0)]
LOGGED = ("predicted_accepted", "predicted_emitted", "predicted_calls", "predicted_reached", "alpha_first",
          "alpha_opt_first")


def _decode(route, monkeypatch, **kw):
    monkeypatch.setattr(_loop._Decoder, "read_on_host", route)
    return D.speculative_decode(**kw, verifier="block-onestep", engine="torch")


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "plain")
def test_host_route_equals_the_accelerators_route(sampling, monkeypatch):
    """Whole decodes, both routes on the same CPU tensors (L = 1, 2 and 4, two seeds, a toy table pair and a tiny
    Llama pair, the last iterations shortened): the same tokens, accepted lengths and draft lengths, and every
    logged prediction (the law of the accepted length, alpha_1) equal bit for bit; the cases include iterations
    that accept every draft (the bonus law formed), none, and (but greedy) some."""
    seen = set()
    for dev, host in decodes_on_both_routes(monkeypatch, _decode, (1, 2, 4), sampling):
        for f in LOGGED:
            np.testing.assert_array_equal(getattr(host, f), getattr(dev, f), err_msg=f)
        n = host.draft_lengths
        seen |= {"all" if a == m else "none" if a == 0 else "some"
                 for a, m in zip(host.accepted[n > 1], n[n > 1], strict=True)}
    # greedy laws are one-hot: here the first draft off the target's argmax is always the first (no "some")
    assert seen == ({"all", "none"} if sampling.get("temperature") == 0.0 else {"all", "none", "some"})


def test_host_route_forms_the_bonus_law_only_when_every_draft_is_accepted(monkeypatch):
    """Every iteration forms its ``L`` draft laws and ``L`` target laws, and the target's bonus law
    :math:`q_{L+1}` only at :math:`\\tau = L`: counted at the one function that forms them. The route before this
    change formed ``L + 1`` target laws per iteration whatever :math:`\\tau`."""
    res, rows = decode_counting_laws(monkeypatch, L=3, verifier="block-onestep")
    drafted = res.draft_lengths[res.draft_lengths > 0]
    taus = res.accepted[res.draft_lengths > 0]
    assert (taus < drafted).any() and (taus == drafted).any() and len(drafted) > 5  # both cases occur
    assert sum(rows) == int(2 * drafted.sum() + (taus == drafted).sum())


def test_bonus_logits_never_formed_are_still_refused(monkeypatch):
    """A non-finite logit in the target's bonus row (a law the host route forms only after ``L`` acceptances) is
    refused with the model and the position, as on the accelerator's route: the draft proposes token 0, which the
    target gives no mass, so no draft is accepted and the bonus law is never formed."""
    draft, target = rejected_pair_with_bad_logits(5)  # the law after 5 tokens: the first iteration's bonus law
    for route in (None, False):
        with pytest.raises(ValueError, match=r"the target model 'broken-target' gave non-finite logits .* position 5"):
            _decode(route, monkeypatch, prompt=[1, 1], draft=draft, target=target, L=3, max_new_tokens=8, rng=0)
