"""Multi-round (recursive) rejection sampling, with and without replacement."""

import importlib
import itertools

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import otspec
from otspec.closed_form import bernoulli_alpha_k
from otspec.testing import chi2_gof
from otspec.testing.strategies import pairs
from tests.gof import assert_end_to_end_sampler

# False-failure rate of each chi-square test below; this file runs at most 10 such
# tests (slow ones included), so it fails spuriously with probability <= 1e-3
# (fixed seeds make the outcome deterministic).
ALPHA_FAIL = 1e-4

ks = st.integers(min_value=1, max_value=4)


def _wor_draft_law(p, k):
    """Independent enumeration of the without-replacement draft law (ordered tuples)."""
    n = len(p)
    law = {}
    for x in itertools.permutations(range(n), k):
        w = 1.0
        for i, t in enumerate(x):
            rest = sum(p[j] for j in range(n) if j not in x[:i])
            if rest <= 0 or p[t] == 0:
                w = 0.0
                break
            w *= p[t] / rest
        if w > 0:
            law[x] = w
    return law


def _cut_bound(q, set_law):
    """min over Omega0 of 1 + q(Omega0) - P(S(X) subset of Omega0): the max-flow bound of any draft law."""
    n = len(q)
    best = np.inf
    for mask in range(1 << n):
        om = {i for i in range(n) if mask >> i & 1}
        inside = sum(w for s, w in set_law.items() if set(s) <= om)
        best = min(best, 1 + sum(q[i] for i in om) - inside)
    return best


# --------------------------------------------------------------------------- with replacement


@given(pairs(max_n=5), ks)
def test_with_replacement_lossless_exact_acceptance(pq, k):
    p, q = pq
    v = otspec.multiround(p, q, k)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-9
    assert chk.max_row_error <= 1e-12
    assert chk.acceptance_error <= 1e-12
    assert v.acceptance() <= float(otspec.alpha_k(p, q, k)) + 1e-12


@given(pairs(max_n=6), ks)
def test_with_replacement_rounds(pq, k):
    p, q = pq
    v = otspec.multiround(p, q, k)
    T = v.targets
    np.testing.assert_array_equal(T[0], q)
    for i in range(k):
        assert np.all(T[i + 1] >= 0)
        np.testing.assert_allclose(T[i + 1].sum(), 1.0, rtol=0, atol=1e-12)
        # a token that round i can reject (q_i < p) has no mass in any later target,
        # whenever the residual (q_i - p)_+ has mass; when it has none, q_i <= p
        # everywhere and q_i, p differ by rounding only (rejection has probability
        # sum(p) - sum(q_i) ~ 1e-16), and the guarded residual keeps a proper law
        if np.maximum(T[i] - p, 0).sum() > 0:
            rejectable = T[i] < p
            assert np.all(T[i + 1 :, rejectable] == 0)
        else:
            assert np.sum(p - T[i]) <= 1e-12
    np.testing.assert_allclose(v.betas, np.minimum(p, T[:k]).sum(axis=1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(v.acceptance(), 1 - np.prod(1 - v.betas), rtol=0, atol=1e-14)


def test_k1_is_maximal_coupling():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    m = otspec.maximal_coupling(p, q)
    for repl in (True, False):
        v = otspec.multiround(p, q, 1, replacement=repl)
        np.testing.assert_allclose(v.acceptance(), m.acceptance(), rtol=0, atol=1e-15)
        for x in range(5):
            np.testing.assert_allclose(v.conditional([x]), m.conditional([x]), rtol=0, atol=1e-15)


def test_by_hand_bernoulli():
    # p = Ber(0.25), q = Ber(0.75) as (tails, heads); round 1: beta_1 = 0.5, q_2 = (0, 1);
    # round 2: beta_2 = p(heads) = 0.25; acceptance 1 - 0.5 * 0.75 = 0.625
    v = otspec.multiround([0.75, 0.25], [0.25, 0.75], 2)
    np.testing.assert_allclose(v.betas, [0.5, 0.25], rtol=0, atol=1e-15)
    np.testing.assert_allclose(v.acceptance(), 0.625, rtol=0, atol=1e-15)
    np.testing.assert_allclose(v.targets[1], [0.0, 1.0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("b", [0.1, 0.75, 1.0])
def test_spectr_fig6_ordering(b):
    """SpecTr App. B.3: OTM-k >= k-Seq >= multi-round for p = Ber(0.25), q = Ber(b)."""
    p, q = [0.75, 0.25], [1 - b, b]
    for k in range(1, 11):
        otm = float(bernoulli_alpha_k(0.25, b, k))
        ks_ = otspec.kseq(p, q, k).acceptance()
        mround = otspec.multiround(p, q, k).acceptance()
        assert otm >= ks_ - 1e-14 >= mround - 2e-14


# --------------------------------------------------------------------------- without replacement


@given(pairs(max_n=5), ks)
def test_without_replacement_lossless_exact_acceptance(pq, k):
    p, q = pq
    assume(k <= np.count_nonzero(p > 0))
    v = otspec.multiround(p, q, k, replacement=False)
    chk = otspec.check_lossless(v)
    assert chk.max_marginal_error <= 1e-9
    assert chk.max_row_error <= 1e-12
    assert chk.acceptance_error <= 1e-12


@given(pairs(min_n=2, max_n=4), ks)
def test_without_replacement_draft_law_and_cut_bound(pq, k):
    p, q = pq
    assume(k <= np.count_nonzero(p > 0))
    v = otspec.multiround(p, q, k, replacement=False)
    law = _wor_draft_law(p, k)
    # draft_law_of agrees with an independent enumeration and sums to 1
    total = 0.0
    for x in itertools.product(range(len(p)), repeat=k):
        w = v.draft_law_of(x)
        np.testing.assert_allclose(w, law.get(x, 0.0), rtol=1e-9, atol=1e-300)
        total += w
    np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-9)
    # no verifier with this draft law beats the max-flow (min-cut) bound for it
    assert v.acceptance() <= _cut_bound(q, law) + 1e-12


def test_without_replacement_can_beat_alpha_k():
    # distinct drafts are worth more than i.i.d. ones: alpha_2 = 0.29, without replacement 1
    p, q = [0.9, 0.1], [0.1, 0.9]
    v = otspec.multiround(p, q, 2, replacement=False)
    np.testing.assert_allclose(v.acceptance(), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(otspec.alpha_k(p, q, 2), 0.29, rtol=0, atol=1e-15)
    assert otspec.check_lossless(v).max_marginal_error <= 1e-15


def test_draft_law_default_is_iid_product():
    v = otspec.kseq([0.2, 0.8], [0.5, 0.5], 2)
    np.testing.assert_allclose(v.draft_law_of((0, 1)), 0.16, rtol=1e-15)
    w = otspec.multiround([0.2, 0.8], [0.5, 0.5], 2)
    np.testing.assert_allclose(w.draft_law_of((1, 1)), 0.64, rtol=1e-15)
    u = otspec.multiround([0.2, 0.8, 0.0], [0.5, 0.5, 0.0], 2, replacement=False)
    assert u.draft_law_of((1, 1)) == 0.0 and u.draft_law_of((0, 2)) == 0.0
    np.testing.assert_allclose(u.draft_law_of((0, 1)), 0.2, rtol=1e-15)


def test_max_histories_guard(monkeypatch):
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    monkeypatch.setattr(importlib.import_module("otspec.multidraft._multiround"), "MAX_HISTORIES", 5)
    v = otspec.multiround(p, q, 3, replacement=False)
    with pytest.raises(ValueError, match="MAX_HISTORIES=5"):
        v.acceptance()


# --------------------------------------------------------------------------- errors


def test_errors():
    with pytest.raises(ValueError, match=r"`k` must be at most the number of tokens with p > 0 \(2\)"):
        otspec.multiround([0.5, 0.5, 0.0], [0.2, 0.3, 0.5], 3, replacement=False)
    with pytest.raises(TypeError, match="`replacement` must be a bool"):
        otspec.multiround([0.5, 0.5], [0.5, 0.5], 2, replacement="no")
    with pytest.raises(ValueError, match="`k` must be an integer >= 1"):
        otspec.multiround([0.5, 0.5], [0.5, 0.5], 0)
    v = otspec.multiround([0.5, 0.5], [0.2, 0.8], 2, replacement=False)
    with pytest.raises(ValueError, match="`drafts` must be distinct"):
        v.conditional([1, 1])
    with pytest.raises(ValueError, match="`drafts` must be distinct"):
        v.sample([0, 0], rng=0)
    with pytest.raises(ValueError, match="`drafts` must be a sequence of k=2"):
        v.conditional([0, 1, 0])
    assert "replacement=False" in repr(v)


def test_inputs_not_mutated():
    p, q = np.array([0.6, 0.4]), np.array([0.1, 0.9])
    p0, q0 = p.copy(), q.copy()
    v = otspec.multiround(p, q, 2)
    otspec.multiround(p, q, 2, replacement=False).acceptance()
    np.testing.assert_array_equal(p, p0)
    np.testing.assert_array_equal(q, q0)
    assert not v.targets.flags.writeable


# --------------------------------------------------------------------------- samplers (chi-square)


def _case():
    rng = np.random.default_rng(21)
    return rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))


@pytest.mark.parametrize("replacement", [True, False])
def test_sampler_given_drafts_chi2(replacement):
    p, q = _case()
    v = otspec.multiround(p, q, 3, replacement=replacement)
    drafts = (3, 1, 0)
    gen = np.random.default_rng(8)
    N = 20_000
    out = np.array([v.sample(drafts, rng=gen) for _ in range(N)])
    assert chi2_gof(np.bincount(out, minlength=5), v.conditional(drafts), alpha_fail=ALPHA_FAIL).passed


@pytest.mark.parametrize("replacement", [True, False])
def test_sampler_end_to_end_chi2(replacement):
    p, q = _case()
    v = otspec.multiround(p, q, 3, replacement=replacement)
    assert_end_to_end_sampler(v, 15_000, 9, ALPHA_FAIL)


def test_sample_drafts_without_replacement_chi2():
    p, q = _case()
    v = otspec.multiround(p, q, 2, replacement=False)
    gen = np.random.default_rng(10)
    N = 20_000
    xs = np.array([v.sample_drafts(rng=gen) for _ in range(N)])
    assert np.all(xs[:, 0] != xs[:, 1])
    counts = np.bincount(xs[:, 0] * 5 + xs[:, 1], minlength=25)
    law = np.array([v.draft_law_of((a, b)) for a in range(5) for b in range(5)])
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed


@pytest.mark.slow
@pytest.mark.parametrize("replacement", [True, False])
def test_sampler_joint_law_chi2_large(replacement):
    rng = np.random.default_rng(31)
    p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    v = otspec.multiround(p, q, 2, replacement=replacement)
    gen = np.random.default_rng(32)
    N = 200_000
    counts = np.zeros(64, dtype=np.int64)
    for _ in range(N):
        x = v.sample_drafts(rng=gen)
        y = v.sample(x, rng=gen)
        counts[(x[0] * 4 + x[1]) * 4 + y] += 1
    law = np.concatenate(
        [
            v.draft_law_of((a, b)) * (v.conditional([a, b]) if v.draft_law_of((a, b)) > 0 else np.zeros(4))
            for a in range(4)
            for b in range(4)
        ]
    )
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed
