"""The lossy figures draw what the exact functions compute (matplotlib, Agg backend)."""

import numpy as np
import pytest

import otspec
from otspec import speculative as sp
from otspec.plotting.lossy import plot_expected_tokens, plot_lossy_frontier, plot_optimal_gamma, synthetic_llm_pair

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_synthetic_pair_is_fixed_and_llm_like():
    p, q = synthetic_llm_pair(1000)
    p2, q2 = synthetic_llm_pair(1000)
    np.testing.assert_array_equal(p, p2)
    np.testing.assert_array_equal(q, q2)
    assert abs(p.sum() - 1) < 1e-12 and abs(q.sum() - 1) < 1e-12
    assert 0.4 < np.minimum(p, q).sum() < 0.7
    # heavy head: the top 10 tokens hold much of the target mass
    assert np.sort(q)[-10:].sum() > 0.3


def test_frontier_plot_data():
    p, q = np.array([0.7, 0.3]), np.array([0.4, 0.6])
    ax = plot_lossy_frontier(p, q, ls=[1.0, 0.5, 0.2], n_points=11)
    front, dots, star = ax.lines[0], ax.lines[1], ax.lines[2]
    x, y = front.get_data()
    np.testing.assert_allclose(y, otspec.mentored_frontier(p, q, x).acceptance, rtol=0, atol=0)
    lc = otspec.lenience_curve(p, q, [1.0, 0.5, 0.2])
    keep = lc.kl <= x.max()
    np.testing.assert_array_equal(dots.get_data()[1], lc.acceptance[keep])
    assert star.get_data()[1][0] == pytest.approx(0.7, abs=1e-15)
    assert ax.get_xlabel().startswith(r"$\mathrm{KL}")


def test_frontier_plot_with_infinite_kl_and_given_axes():
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.3, 0.3, 0.4])
    fig, ax = plt.subplots()
    assert plot_lossy_frontier(p, q, ax=ax, title="t") is ax
    assert ax.get_title() == "t"


def test_expected_tokens_plot():
    ax = plot_expected_tokens(gammas=(1, 4))
    x, y = ax.lines[1].get_data()
    np.testing.assert_array_equal(y, sp.expected_tokens(x, 4))
    assert y[-1] == 5.0  # alpha = 1 limit, exactly gamma + 1


def test_optimal_gamma_plot():
    ax = plot_optimal_gamma(cs=(0.05,))
    x, y = ax.lines[0].get_data()
    np.testing.assert_array_equal(y, sp.optimal_gamma(x, 0.05))
    assert np.all(x > 0.05)  # drawn only where speculative decoding helps


def test_import_otspec_does_not_import_matplotlib():
    import subprocess
    import sys

    code = "import sys, otspec, otspec.speculative, otspec.lossy; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_lossy_rules_draw_infinite_kl_past_a_break_never_at_a_finite_kl():
    from otspec.plotting.lossy import plot_lossy_rules

    # tokens 2 and 3 fall below typical acceptance's threshold: their target mass is lost, KL(q || r) = inf
    p, q = np.full(4, 0.25), np.array([0.5, 0.45, 0.04, 0.01])
    assert otspec.typical_acceptance_verifier(p, q).kl() == np.inf
    ax = plot_lossy_rules(p, q, n_points=5)
    (typ,) = [ln for ln in ax.lines if "typical" in ln.get_label()]
    assert typ.get_label().endswith(r"KL = $\infty$")
    assert typ.get_transform() is not ax.transData  # x in axes coordinates: no KL value at all
    assert 0.9 < typ.get_xdata()[0] < 1.0
    assert typ.get_ydata()[0] == pytest.approx(otspec.typical_acceptance_verifier(p, q).acceptance(), abs=1e-15)
    assert r"$\infty$" in [t.get_text() for t in ax.texts]  # the column's tick
    d_max = 1.05 * otspec.mentored_frontier(p, q, [0.0]).kl_qp
    assert max(ax.get_xticks()) <= d_max  # numeric ticks stop before the break


def test_lossy_rules_draw_a_finite_kl_at_its_value():
    from otspec.plotting.lossy import plot_lossy_rules

    p, q = np.array([0.3, 0.3, 0.4]), np.array([0.35, 0.35, 0.3])  # every token accepted: r = p, KL finite
    v = otspec.typical_acceptance_verifier(p, q)
    ax = plot_lossy_rules(p, q, n_points=5)
    (typ,) = [ln for ln in ax.lines if "typical" in ln.get_label()]
    assert typ.get_xdata()[0] == v.kl() and "KL =" not in typ.get_label()
    assert not ax.texts
