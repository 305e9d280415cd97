"""The engines' lossy rules: transformers' ensemble verification and vLLM's typical acceptance.

Each is checked against its own stated output law by exact enumeration
(``max_law_error``), its sampler by chi-square, and its place on the
KL-acceptance plane against mentored decoding's frontier.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import otspec
from otspec.testing import chi2_gof
from tests.strategies import pairs

# This file runs 4 chi-square tests at 1e-4 each: spurious failure <= 4e-4 (fixed seeds).
ALPHA_FAIL = 1e-4
TOL = 1e-9
P5 = np.array([0.35, 0.25, 0.2, 0.15, 0.05])
Q5 = np.array([0.1, 0.3, 0.15, 0.05, 0.4])


@given(pq=pairs(min_n=1, max_n=6), w=st.floats(0.0, 1.0))
def test_ensemble_law_is_the_mixture(pq, w):
    p, q = pq
    v = otspec.ensemble_verifier(p, q, w)
    chk = otspec.check_lossless(v)
    assert chk.max_law_error <= TOL and chk.acceptance_error <= TOL and chk.max_row_error <= 1e-12
    mix = w * q + (1 - w) * p
    assert np.max(np.abs(v.output_law() - mix)) <= 1e-12
    tv_pq = 0.5 * np.abs(p - q).sum()
    assert v.tv() == pytest.approx((1 - w) * tv_pq, abs=1e-12)
    assert v.acceptance() == pytest.approx(1 - w * tv_pq, abs=1e-12)
    if w == 1.0:
        assert chk.passed


def test_ensemble_transformers_anchor():
    """transformers' own test: draft 0.80, target 0.40, w = 0.7 accepts at ratio 0.65."""
    v = otspec.ensemble_verifier([0.80, 0.10, 0.05, 0.05], [0.40, 0.30, 0.20, 0.10], 0.7)
    assert v.conditional([0])[0] == pytest.approx(0.65, abs=1e-15)


@given(pq=pairs(min_n=1, max_n=6), eps=st.floats(0.0, 1.0), delta=st.floats(0.0, 1.0))
def test_typical_acceptance_law(pq, eps, delta):
    p, q = pq
    v = otspec.typical_acceptance_verifier(p, q, epsilon=eps, delta=delta)
    chk = otspec.check_lossless(v)
    assert chk.max_law_error <= TOL and chk.acceptance_error <= TOL and chk.max_row_error == 0.0
    H = -math.fsum(q * np.log(q + 1e-5))
    thr = min(eps, delta * math.exp(-H))
    assert np.array_equal(v.accepted, q > thr)
    assert v.replacement == int(np.argmax(q))
    assert v.accept_rate() <= v.acceptance() + 1e-15


def test_typical_acceptance_defaults_and_errors():
    v = otspec.typical_acceptance_verifier(P5, Q5)
    assert (v.epsilon, v.delta, v.guard) == (0.09, 0.3, 1e-5)
    assert math.isinf(v.kl()) == bool(np.any((v.output_law() == 0) & (Q5 > 0)))
    with pytest.raises(ValueError, match="`epsilon`"):
        otspec.typical_acceptance_verifier(P5, Q5, epsilon=-1.0)
    with pytest.raises(TypeError, match="`delta`"):
        otspec.typical_acceptance_verifier(P5, Q5, delta="0.3")
    with pytest.raises(ValueError, match="`w`"):
        otspec.ensemble_verifier(P5, Q5, 1.5)


@pytest.mark.parametrize("make", [lambda: otspec.ensemble_verifier(P5, Q5, 0.6),
                                  lambda: otspec.typical_acceptance_verifier(P5, Q5, epsilon=0.2)])
def test_lossy_sampler_chi2(make):
    v = make()
    gen = np.random.default_rng(7)
    N = 30_000
    xs = gen.choice(5, size=N, p=P5)
    ys = np.array([v.sample([x], rng=gen) for x in xs])
    assert chi2_gof(np.bincount(ys, minlength=5), v.output_law(), alpha_fail=ALPHA_FAIL).passed
    hit = int(np.sum(ys == xs))
    a = v.acceptance()
    if 0 < a < 1:
        assert chi2_gof(np.array([hit, N - hit]), np.array([a, 1 - a]), alpha_fail=ALPHA_FAIL).passed


@given(pq=pairs(min_n=2, max_n=6), w=st.floats(0.0, 1.0))
def test_ensemble_is_on_or_below_the_mentored_frontier(pq, w):
    """Mentored decoding is KL-optimal: at the ensemble rule's KL budget it accepts at least as much."""
    p, q = pq
    v = otspec.ensemble_verifier(p, q, w)
    kl = v.kl()
    if math.isfinite(kl):
        best = otspec.mentored(p, q, kl).acceptance
        assert v.acceptance() <= best + 1e-7


def test_registry_entries():
    for name in ("ensemble", "typical"):
        spec = otspec.multidraft.get_verifier(name)
        assert not spec.lossless and spec.single_draft
    v = otspec.multidraft.get_verifier("ensemble").build(P5, Q5, 1, w=0.5)
    assert v.w == 0.5
    v = otspec.multidraft.get_verifier("typical").build(P5, Q5, 1)
    assert v.epsilon == 0.09
    with pytest.raises(ValueError, match="`k` must be 1"):
        otspec.multidraft.get_verifier("typical").build(P5, Q5, 2)


def test_plot_lossy_rules_draws_on_given_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from otspec.plotting.lossy import plot_lossy_rules

    fig, ax = plt.subplots()
    out = plot_lossy_rules(P5, Q5, ax=ax, weights=[0.0, 0.5, 1.0], typical=((0.09, 0.3), (0.5, 0.5)))
    assert out is ax
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("ensemble" in s for s in labels) and any("typical" in s for s in labels)
    plt.close(fig)
    ax2 = plot_lossy_rules(P5, Q5)
    assert ax2 is not None
    plt.close(ax2.figure)
