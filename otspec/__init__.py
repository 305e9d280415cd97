"""otspec: exact optimal-transport analysis of speculative-decoding verifiers.

Speculative decoding drafts tokens with a small model ``p`` (the draft) and
verifies them against a large model ``q`` (the target) so that the output
still follows ``q``. otspec computes exactly what verifiers can and do
achieve, and runs them. Notation everywhere: ``p`` is the draft distribution
and ``q`` the target (Leviathan et al. swap the letters).

Where to start: ``otspec.alpha_k(p, q, k)`` (the optimal acceptance of ``k``
i.i.d. drafts); the verifiers (``maximal_coupling``, ``kseq``,
``multiround``, ``optimal_verifier``, ``mentored``, ``lenient_verifier``)
and ``check_lossless``; the subpackages ``otm``, ``multidraft``, ``lossy``,
``block``, ``spectr``, ``decoding`` (torch), ``plotting`` (matplotlib).
The architecture page of the docs maps the tree.
"""

from . import block, closed_form, lossy, models, multidraft, otm, spectr, speculative, testing
from ._validation import SIMPLEX_TOL
from ._verifier import LOSSLESS_TOL, LosslessCheck, Verifier, VerifierCheck, check_lossless
from .closed_form import alpha_k_lower_bound, alpha_k_upper_bound
from .lossy import (
    LenienceCurve,
    LenientVerifier,
    MentoredFrontier,
    MentoredResult,
    MentoredVerifier,
    lenience_curve,
    lenient_verifier,
    mentored,
    mentored_frontier,
    mentored_verifier,
)
from .models import (
    MarkovModel,
    MemorylessModel,
    Model,
    TableModel,
    conditional_tables,
    joint_law,
    random_markov_model,
    random_memoryless_model,
    random_table_model,
    sequence_probability,
    validate_model,
    validate_model_pair,
)
from .multidraft import (
    VERIFIERS,
    KSeq,
    MaximalCoupling,
    MultiRound,
    OptimalVerifier,
    VerifierSpec,
    get_verifier,
    kseq,
    kseq_beta,
    kseq_p_acc,
    kseq_residual,
    kseq_rho_star,
    maximal_coupling,
    multiround,
    optimal_verifier,
    register_verifier,
)
from .otm import MinCut, OTMPlanVerifier, OTMResult, SolverError, alpha_k, min_cut, otm_lp, otm_lp_tuples

__version__ = "0.1.0"

__all__ = [
    "KSeq",
    "LOSSLESS_TOL",
    "LenienceCurve",
    "LenientVerifier",
    "LosslessCheck",
    "MarkovModel",
    "MaximalCoupling",
    "MemorylessModel",
    "MentoredFrontier",
    "MentoredResult",
    "MentoredVerifier",
    "MinCut",
    "Model",
    "MultiRound",
    "OTMPlanVerifier",
    "OTMResult",
    "OptimalVerifier",
    "SIMPLEX_TOL",
    "SolverError",
    "TableModel",
    "VERIFIERS",
    "Verifier",
    "VerifierCheck",
    "VerifierSpec",
    "alpha_k",
    "alpha_k_lower_bound",
    "alpha_k_upper_bound",
    "block",
    "check_lossless",
    "closed_form",
    "conditional_tables",
    "get_verifier",
    "joint_law",
    "kseq",
    "kseq_beta",
    "kseq_p_acc",
    "kseq_residual",
    "kseq_rho_star",
    "lenience_curve",
    "lenient_verifier",
    "lossy",
    "maximal_coupling",
    "mentored",
    "mentored_frontier",
    "mentored_verifier",
    "min_cut",
    "models",
    "multidraft",
    "multiround",
    "optimal_verifier",
    "otm",
    "otm_lp",
    "otm_lp_tuples",
    "random_markov_model",
    "random_memoryless_model",
    "random_table_model",
    "register_verifier",
    "sequence_probability",
    "spectr",
    "speculative",
    "testing",
    "validate_model",
    "validate_model_pair",
]
