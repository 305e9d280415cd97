"""The block-verification figure (arXiv:2403.10444, Figure 2) is built from the exact functions."""

import subprocess
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from otspec.block import bernoulli_block_length, bernoulli_token_length  # noqa: E402
from otspec.plotting.block import figure2_data, plot_figure2  # noqa: E402


def test_figure2_data_matches_closed_forms():
    d = figure2_data(0.75, (0.25, 0.6), 6)
    for i, p in enumerate(d.ps):
        for j, L in enumerate(d.Ls):
            np.testing.assert_allclose(d.lengths["token"][i, j], bernoulli_token_length(p, 0.75, int(L)), atol=1e-12)
            np.testing.assert_allclose(d.lengths["block"][i, j], bernoulli_block_length(p, 0.75, int(L)), atol=1e-12)
    assert np.all(d.lengths["token"] <= d.lengths["block-onestep"] + 1e-12)
    assert np.all(d.lengths["block-onestep"] <= d.lengths["block"] + 1e-12)


def test_plot_figure2_lines_and_axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    d = figure2_data(0.75, (0.25, 0.5), 4)
    out = plot_figure2(data=d, ax=ax)
    assert out is ax
    assert len(ax.lines) == 6
    # plotted values are E[tau] + 1 by default, E[tau] without the bonus
    np.testing.assert_allclose(ax.lines[2].get_ydata(), d.lengths["block"][0] + 1)
    ax2 = plot_figure2(data=d, include_bonus=False)
    np.testing.assert_allclose(ax2.lines[0].get_ydata(), d.lengths["token"][0])
    plt.close("all")


def test_bad_input():
    with pytest.raises(ValueError, match="`L_max` must be <= 16"):
        figure2_data(0.75, (0.5,), 40)
    with pytest.raises(ValueError, match="`q` must lie in"):
        figure2_data(1.5, (0.5,), 3)
    with pytest.raises(ValueError, match="`ps` must hold at least one"):
        figure2_data(0.75, (), 3)


def test_import_otspec_block_does_not_import_matplotlib():
    code = "import sys, otspec, otspec.block; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_figure2_label_says_what_is_plotted():
    import matplotlib.pyplot as plt

    d = figure2_data(0.75, (0.25,), 1)
    ax = plot_figure2(data=d)
    assert ax.lines[0].get_ydata()[0] == 1.5  # L = 1: 1 - |0.25 - 0.75| = half a draft token accepted, plus one
    assert "per target call" in ax.get_ylabel() and "+ 1" in ax.get_ylabel()
    ax2 = plot_figure2(data=d, include_bonus=False)
    assert ax2.lines[0].get_ydata()[0] == 0.5
    assert "accepted draft tokens" in ax2.get_ylabel() and "+ 1" not in ax2.get_ylabel()
    plt.close("all")
