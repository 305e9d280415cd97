"""The papers' figures from the package's exact values (matplotlib).

``import otspec`` does not import this package; ``otspec.plotting`` (or
``import otspec.plotting``) does, checks that matplotlib is installed (an
:class:`ImportError` with the install command otherwise) and imports it only
when a figure is drawn. Every function takes the axes as the keyword ``ax=None``
(a new figure when None), draws on them, returns them and never calls
``plt.show()``; legends sit to the right of the data (save with
``bbox_inches="tight"`` when you pass your own axes).

* :mod:`otspec.plotting.multidraft`: SpecTr Figures 4, 5, 6 and the
  conference version's Figure 3 (multi-draft token verifiers).
* :mod:`otspec.plotting.block`: Figure 2 of the block verification paper.
* :mod:`otspec.plotting.lossy`: the acceptance-KL frontier of mentored
  decoding with lenience; Leviathan et al.'s Figures 2 and 3.
* :mod:`otspec.plotting.spectr`: block efficiency against the number of drafts.

The guide page "Reproduce the papers' figures" (docs/guide/figures.rst) has
one runnable example per figure.
"""

from .._deps import check_installed as _check_installed

_check_installed("matplotlib", "otspec.plotting", "plot")

from . import block, lossy, multidraft, spectr  # noqa: E402
from .block import plot_figure2  # noqa: E402
from .lossy import plot_expected_tokens, plot_lossy_frontier, plot_optimal_gamma  # noqa: E402
from .multidraft import plot_acceptance_vs_b, plot_spectr_fig4, plot_spectr_fig5, plot_spectr_fig6  # noqa: E402
from .spectr import plot_block_efficiency  # noqa: E402

__all__ = [
    "block",
    "lossy",
    "multidraft",
    "spectr",
    "plot_acceptance_vs_b",
    "plot_block_efficiency",
    "plot_expected_tokens",
    "plot_figure2",
    "plot_lossy_frontier",
    "plot_optimal_gamma",
    "plot_spectr_fig4",
    "plot_spectr_fig5",
    "plot_spectr_fig6",
]
