"""Figures of the multi-draft comparison: data from the exact functions, axes returned, no show()."""

import numpy as np
import pytest

import otspec
from otspec.closed_form import bernoulli_alpha_k, uniform_alpha_k

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from otspec.plotting import multidraft as md  # noqa: E402


def test_acceptance_curves_match_exact_functions():
    p, q = md.bernoulli_pair(0.25, 0.75)
    c = md.acceptance_curves(p, q, [1, 2, 3], md.METHODS)
    for j, k in enumerate([1, 2, 3]):
        np.testing.assert_allclose(c.values["otm"][j], bernoulli_alpha_k(0.25, 0.75, k), rtol=0, atol=1e-15)
        assert c.values["kseq"][j] == otspec.kseq(p, q, k).acceptance()
        assert c.values["multiround"][j] == otspec.multiround(p, q, k).acceptance()
    # without replacement: k beyond the support of p is NaN
    assert np.isnan(c.values["multiround-wor"][2])
    assert c.values["multiround-wor"][1] == otspec.multiround(p, q, 2, replacement=False).acceptance()


def test_uniform_pair():
    p, q = md.uniform_pair(120, 40)
    assert p.shape == q.shape == (120,)
    np.testing.assert_allclose(otspec.alpha_k(p, q, 3), uniform_alpha_k(120, 40, 3), rtol=0, atol=1e-15)
    p, q = md.uniform_pair(3, 6)
    assert p.shape == (6,) and p[3:].sum() == 0


@pytest.mark.parametrize(
    "fn,kwargs,n_lines",
    [
        (md.plot_spectr_fig4, {"ks": range(1, 4)}, 8),
        (md.plot_spectr_fig6, {"ks": range(1, 4)}, 9),
        (md.plot_spectr_fig5, {"ks": range(1, 4), "d_qs": (10, 60)}, 4),
        (md.plot_acceptance_vs_b, {"bs": np.linspace(0, 1, 5), "ks": (1, 2)}, 3),
    ],
)
def test_plots_return_axes_and_draw_exact_values(fn, kwargs, n_lines):
    fig, ax = plt.subplots()
    out = fn(**kwargs, ax=ax)
    assert out is ax
    assert len(ax.get_lines()) == n_lines
    plt.close(fig)
    ax2 = fn(**kwargs)  # ax=None makes a new figure
    assert ax2.figure is not fig
    plt.close(ax2.figure)


def test_fig4_lines_hold_exact_values():
    fig, ax = plt.subplots()
    md.plot_spectr_fig4(bs=(0.75,), ks=range(1, 6), ax=ax)
    otm, kseq = ax.get_lines()
    p, q = md.bernoulli_pair(0.25, 0.75)
    np.testing.assert_array_equal(otm.get_ydata(), otspec.alpha_k(p, q, list(range(1, 6))))
    np.testing.assert_array_equal(kseq.get_ydata(), [otspec.kseq(p, q, k).acceptance() for k in range(1, 6)])
    plt.close(fig)


def test_errors():
    with pytest.raises(ValueError, match="`methods` entries must be among"):
        md.acceptance_curves([0.5, 0.5], [0.5, 0.5], [1], ("lp",))
    with pytest.raises(ValueError, match="`b` must lie in"):
        md.bernoulli_pair(0.25, 1.5)
    with pytest.raises(ValueError, match="`d_q` must be an integer >= 1"):
        md.uniform_pair(10, 0)
    with pytest.raises(ValueError, match="`ks` must be an integer >= 1"):
        md.acceptance_curves([0.5, 0.5], [0.5, 0.5], [0])


def test_every_plot_function_takes_ax_by_keyword_and_refuses_positional_axes():
    import inspect

    from otspec import plotting

    for name in plotting.__all__:
        fn = getattr(plotting, name)
        if not name.startswith("plot_"):
            continue
        par = inspect.signature(fn).parameters["ax"]
        assert par.kind is par.KEYWORD_ONLY and par.default is None, name
    fig, ax = plt.subplots()
    with pytest.raises(TypeError, match="pass the axes by keyword"):
        plotting.plot_figure2(ax)
    with pytest.raises(TypeError, match="positional"):
        plotting.plot_spectr_fig4(ax)
    plt.close(fig)


def test_series_colours_are_distinct():
    fig, ax = plt.subplots()
    md.plot_spectr_fig5(d_qs=(5, 10, 20, 40, 60, 120), ks=[1, 2], show_kseq=False, ax=ax)
    colours = {line.get_color() for line in ax.get_lines()}
    assert len(colours) == 6
    plt.close(fig)


def test_fig4_curves_that_meet_stay_readable():
    fig, ax = plt.subplots()
    md.plot_spectr_fig4(bs=(0.1, 0.25), ks=range(1, 4), ax=ax)
    lines = ax.get_lines()
    assert all(ln.get_linewidth() <= 1.5 and ln.get_markersize() <= 6 for ln in lines)  # no thick bands
    # both targets reach 1.0 at k = 3: their markers sit side by side, the values unmoved
    x_a, x_b = lines[0].get_xdata(), lines[2].get_xdata()
    assert np.all(x_a < x_b) and np.all(np.abs(x_a - np.arange(1, 4)) < 0.1)
    assert lines[0].get_ydata()[-1] == lines[2].get_ydata()[-1] == 1.0
    # OTM-k and k-Seq differ in dash and marker, so one drawn over the other still shows both
    assert lines[0].get_linestyle() != lines[1].get_linestyle() and lines[0].get_marker() != lines[1].get_marker()
    plt.close(fig)
