r"""SpecTr over sequences: draft sets, DraftSelection, exact block efficiency.

``k`` draft sequences (SpecTr's ``K``) of length ``L`` are drawn from the draft model
:math:`\mathcal M_s` (i.i.d., SpecTr eq. 7, or as the leaves of a prefix
tree with branching :math:`(k_1, \dots, k_L)`, :math:`\prod k_i = K`,
Appendix D); DraftSelection (Algorithm 3) applies a token-level verifier
(:math:`\mathcal M_s(\cdot \mid \text{prefix})^{\otimes k}` to
:math:`\mathcal M_b(\cdot \mid \text{prefix})`) to the surviving drafts at each
position, keeps the drafts that agree with its output and stops at the first
correction token or after ``L`` positions with a bonus token. The decoded
tokens follow the target model :math:`\mathcal M_b` exactly (Theorem 2,
:func:`check_lossless`); block efficiency is the expected number of decoded
tokens per target call (:func:`block_efficiency`, exact by enumeration;
:func:`block_efficiency_mc` by simulation with a confidence interval).

Models are objects with ``vocab_size`` and ``next_dist(prefix)``
(:mod:`otspec.models`). At one position ``p`` is the draft law and ``q`` the
target law, as everywhere in otspec.
"""

from ._common import VERIFIER_NAMES, VerifierFactory, resolve_verifier
from ._dp import optimal_block_efficiency
from ._drafts import DraftSet, iid_drafts, prefix_tree_drafts
from ._exact import SpecTrCheck, block_efficiency, check_lossless, decoded_law, length_law
from ._mc import MCEstimate, block_efficiency_mc
from ._selection import draft_selection, spectr_step

__all__ = [
    "VERIFIER_NAMES",
    "DraftSet",
    "MCEstimate",
    "SpecTrCheck",
    "VerifierFactory",
    "block_efficiency",
    "block_efficiency_mc",
    "check_lossless",
    "decoded_law",
    "draft_selection",
    "iid_drafts",
    "length_law",
    "optimal_block_efficiency",
    "prefix_tree_drafts",
    "resolve_verifier",
    "spectr_step",
]
