"""The chain decoders' last iterations: ``L_i = min(L, left - 1)`` drafts when ``left`` tokens remain before
``max_new_tokens`` (plain decoding's step at ``left = 1``), the output law still the target's, and every
per-iteration record that of the iteration as made.

Losslessness is tested by Pearson's chi-square of the joint law of all the generated tokens against the target's
exact law (:func:`otspec.decoding.exact_prefix_law`: plain target scoring, no verifier), with ``max_new_tokens``
not a multiple of ``L + 1`` so that the shortened iterations are met. Each chi-square test fails spuriously with
probability ALPHA_FAIL = 1e-4; this file holds at most 9 of them (the slow ones included), so its false-failure
rate stays below 1e-3; the seeds are fixed, so a run is reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import otspec.decoding as D  # noqa: E402
from otspec.testing import chi2_gof  # noqa: E402
from tests.toy_lm import toy_target_draft  # noqa: E402

torch.set_num_threads(1)
ALPHA_FAIL = 1e-4
V = 3
PROMPT = [1, 2]

#: Every chain family the loop dispatches, ``(verifier, k, engine)``: token-level rules on the host and on the
#: device, the block verifiers (Sun et al.'s v1 with its residual calls, one-step) and an enumerated multi-draft
#: block one.
FAMILIES = [("token", 1, "numpy"), ("token", 1, "torch"), ("kseq", 2, "numpy"), ("multiround", 2, "torch"),
            ("block", 1, "numpy"), ("block", 1, "torch"), ("block-onestep", 1, "numpy"), ("block-onestep", 1, "torch"),
            ("multidraft-plan", 2, "numpy")]


@pytest.fixture(scope="module")
def toy_pair():
    return toy_target_draft(V, seed=0, named=True)


def _joint_counts(target, draft, m, runs, **kw):
    """Counts of the ``m`` generated tokens of ``runs`` decodes (``max_new_tokens = m``) on the exact law's cells
    (the last cell: outside the support), the exact law, and the draft lengths met."""
    cells, law = D.exact_prefix_law(target, PROMPT, m)
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1, dtype=np.int64)
    gen = torch.Generator().manual_seed(2024)
    met: set = set()
    for _ in range(runs):
        res = D.speculative_decode(PROMPT, draft=draft, target=target, max_new_tokens=m, rng=gen, **kw)
        assert res.tokens.shape[0] == m == int(res.emitted.sum())  # nothing made past the limit
        counts[index.get(tuple(res.tokens.tolist()), len(cells))] += 1
        met.update(int(n) for n in res.draft_lengths)
    return counts, np.append(law, 0.0), met


def test_joint_law_with_shortened_iterations_token_device(toy_pair):
    """Speculative sampling on the device, ``L = 3``, 3 tokens: the first iteration drafts 2, the later ones 1 or
    none (plain decoding's step); the joint law of the 3 tokens is the target's (chi-square, 27 cells)."""
    target, draft = toy_pair
    counts, law, met = _joint_counts(target, draft, 3, 600, verifier="token", L=3, engine="torch")
    assert met == {0, 1, 2}  # every shortened length met, none of L = 3
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, g


@pytest.mark.slow
@pytest.mark.parametrize("verifier, k, engine", FAMILIES)
def test_joint_law_with_shortened_iterations(toy_pair, verifier, k, engine):
    """Every chain family and route, ``L = 2``, 4 tokens (not a multiple of ``L + 1``): full iterations, then
    ``L_i = 1`` or plain decoding's step (only the latter for the schemes that make ``L_i + 1`` tokens); the
    joint law of the 4 tokens is the target's (chi-square, 81 cells)."""
    target, draft = toy_pair
    counts, law, met = _joint_counts(target, draft, 4, 2000, verifier=verifier, k=k, L=2, engine=engine)
    # v1 block and the multi-draft plan make L_i + 1 tokens every iteration: 3, then plain decoding's step
    assert met == ({0, 2} if verifier in ("block", "multidraft-plan") else {0, 1, 2})
    g = chi2_gof(counts, law, alpha_fail=ALPHA_FAIL)
    assert g.outside_support == 0 and g.passed, (verifier, engine, g)


@pytest.mark.parametrize("verifier, k, engine", FAMILIES)
def test_records_of_shortened_iterations_are_their_own(verifier, k, engine):
    """Identical draft and target: every draft is accepted, so each iteration's records are known exactly -- ``L_i``
    accepted, ``L_i + 1`` made (the v1 block verifier's too), predictions equal to them, ``reached`` ones up to
    ``L_i`` and zeros after, :math:`\\alpha_1 = 1`; plain decoding's step (``L_i = 0``) verifies nothing: NaN
    acceptances, which :func:`summarize` leaves out."""
    lm = D.CallableLM(lambda ids: torch.sin(ids[..., None] * torch.arange(1.0, V + 1)), vocab_size=V)
    L = 3
    for m, lengths in [(7, [3, 2]), (5, [3, 0]), (3, [2]), (1, [0]), (10, [3, 3, 1])]:
        res = D.speculative_decode(PROMPT, draft=lm, target=lm, verifier=verifier, k=k, L=L, max_new_tokens=m,
                                   rng=0, engine=engine)
        assert res.engine == engine
        assert_full_acceptance_records(res, lengths, L, m)


def assert_full_acceptance_records(res, lengths, L: int, m: int) -> None:
    """The records of a run of ``m`` tokens whose every draft is accepted, iteration ``i`` drafting ``lengths[i]``
    (``L`` at most; a tree's levels): accepted, made and predicted exactly, ``reached`` ones up to ``L_i``,
    :math:`\alpha_1 = 1`, NaN for plain decoding's step (``L_i = 0``)."""
    n = np.array(lengths)
    assert res.L == L and res.tokens.shape[0] == m
    np.testing.assert_array_equal(res.draft_lengths, n)
    np.testing.assert_array_equal(res.accepted, n)
    np.testing.assert_array_equal(res.emitted, n + 1)
    np.testing.assert_array_equal(res.target_calls, np.ones_like(n))
    np.testing.assert_allclose(res.predicted_accepted, n, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.predicted_emitted, n + 1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.predicted_calls, 1.0, rtol=0, atol=0)
    reached = (np.arange(L)[None, :] < n[:, None]).astype(float)
    np.testing.assert_array_equal(res.reached, reached)
    np.testing.assert_allclose(res.predicted_reached, reached, rtol=0, atol=1e-12)
    for a in (res.alpha_first, res.alpha_opt_first):
        np.testing.assert_allclose(a[n > 0], 1.0, rtol=0, atol=1e-12)
        assert np.isnan(a[n == 0]).all()
    S = D.summarize([res])
    assert S.block_efficiency == S.predicted_block_efficiency == m / len(n)
    if (n > 0).any():
        assert S.alpha_first == pytest.approx(1.0, abs=1e-12) and S.alpha_opt_first == pytest.approx(1.0, abs=1e-12)
    else:
        assert math.isnan(S.alpha_first) and math.isnan(S.iid_block_efficiency)


@pytest.mark.parametrize("verifier, k, engine", [f for f in FAMILIES if f[0] != "multidraft-plan"])
def test_predictions_of_shortened_iterations_agree_with_measured(toy_pair, verifier, k, engine):
    """Short runs (``L = 3``, 3 tokens: every iteration shortened, 2, 1 or no drafts) -- measured accepted tokens
    against the exact predictions of the shortened iterations (martingale z-score; predictions made for ``L`` drafts
    instead of ``L_i`` would overshoot)."""
    target, draft = toy_pair
    runs = [D.speculative_decode(PROMPT, draft=draft, target=target, verifier=verifier, k=k, L=3, max_new_tokens=3,
                                 rng=s, engine=engine) for s in range(60)]
    lengths = np.concatenate([r.draft_lengths for r in runs])
    assert (lengths < 3).all() and (lengths == 2).all() == (verifier == "block")  # v1 always makes L_i + 1
    S = D.summarize(runs)
    assert abs(S.z_accepted) < 4.0, (verifier, engine, S.z_accepted)
    np.testing.assert_allclose(S.per_position.sum(), S.mean_accepted, rtol=1e-12)
    np.testing.assert_allclose(S.per_position_predicted.sum(), S.predicted_mean_accepted, rtol=1e-12)


def test_eos_still_stops_the_run():
    """An EOS ends the run whatever the iteration drafted (where it comes is not known before it is drawn)."""
    lm = D.CallableLM(lambda ids: torch.where(torch.arange(V) == 2, 5.0, 0.0).expand(ids.shape + (V,)).clone(),
                      vocab_size=V)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        res = D.speculative_decode(PROMPT, draft=lm, target=lm, L=3, max_new_tokens=6, rng=gen, eos_token_id=2)
        toks = res.tokens.tolist()
        assert 2 in toks and toks.index(2) == len(toks) - 1
        assert res.draft_lengths[0] == 3
