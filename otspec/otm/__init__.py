"""OTM-k: the optimal acceptance of ``k`` i.i.d. drafts and its transport LPs.

``alpha_k`` (closed form after one sort, Sun et al., SpecTr,
arXiv:2310.15141, Theorem 1 and Lemma 3), the minimising cut, the reduced
and the tuple LPs of SpecTr's eq. (4), and the one HiGHS helper and multiset
enumerator every LP of the package uses. Notation: ``p`` draft, ``q`` target.
"""

from ._alpha import MinCut, alpha_k, min_cut
from ._highs import LP_CHECK_TOL, SolverError
from ._lp import OTMPlanVerifier, OTMResult, membership_plan, otm_lp, otm_lp_tuples, set_weights
from ._without_replacement import (
    alpha_k_without_replacement,
    min_cut_without_replacement,
    prob_within_without_replacement,
    uncovered_prefixes,
    wor_draft_prob,
    wor_lp,
)

__all__ = [
    "alpha_k_without_replacement",
    "membership_plan",
    "min_cut_without_replacement",
    "prob_within_without_replacement",
    "uncovered_prefixes",
    "wor_draft_prob",
    "wor_lp",
    "LP_CHECK_TOL",
    "MinCut",
    "OTMPlanVerifier",
    "OTMResult",
    "SolverError",
    "alpha_k",
    "min_cut",
    "otm_lp",
    "otm_lp_tuples",
    "set_weights",
]
