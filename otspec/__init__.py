"""otspec: exact optimal-transport analysis of speculative-decoding verifiers, and the verifiers themselves.

Speculative decoding drafts tokens with a small model ``p`` (the draft) and
verifies them against a large model ``q`` (the target) so that the output
still follows ``q``. otspec computes exactly what verifiers can and do
achieve — every number checked against an independent route — and runs them
on real language models. Notation everywhere: ``p`` is the draft
distribution and ``q`` the target (Leviathan et al. swap the letters).

Where to start:

* ``otspec.alpha_k(p, q, k)``: the optimal acceptance of ``k`` i.i.d. drafts,
  exact after one sort; ``otspec.otm_lp(p, q, k).verifier`` an optimal plan.
* Verifiers, all :class:`otspec.Verifier` with one contract (``sample_drafts``,
  ``sample``, ``acceptance``, ``output_law``): ``maximal_coupling``, ``kseq``,
  ``multiround``, ``optimal_verifier``, ``mentored``, ``lenient_verifier``;
  ``check_lossless(verifier)`` checks one exactly; ``otspec.testing.chi2_gof``
  tests a sampler.
* Subpackages: ``otm``, ``multidraft`` (the registry of verifier names),
  ``lossy``, ``block`` (with ``models``), ``spectr``, ``tree`` (draft
  trees: shapes, processes, tree verifiers, optima), ``speculative``,
  ``closed_form``, ``testing``; ``decoding`` (real models, needs torch) and
  ``plotting`` (the papers' figures, needs matplotlib) load on first use.
* Guides with runnable examples: docs/guide/ (start with otm.rst; the
  figures in figures.rst, real models in decoding.rst); the README's
  "Four things you can do in five minutes".
"""

from . import (
    _catalogue,  # noqa: F401 - registers the token-level and lossy verifiers before block and spectr read them
    block,
    closed_form,
    lossy,
    models,
    multidraft,
    otm,
    spectr,
    speculative,
    testing,
    tree,
)
from ._validation import SIMPLEX_TOL
from ._verifier import LOSSLESS_TOL, LosslessCheck, Verifier, VerifierCheck, check_lossless
from .closed_form import alpha_k_lower_bound, alpha_k_upper_bound
from .lossy import (
    EnsembleVerifier,
    LenienceCurve,
    LenientVerifier,
    MentoredFrontier,
    MentoredResult,
    MentoredVerifier,
    TypicalAcceptanceVerifier,
    ensemble_verifier,
    lenience_curve,
    lenient_verifier,
    mentored,
    mentored_frontier,
    mentored_verifier,
    typical_acceptance_verifier,
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
    GreedyDraftVerifier,
    KhistiVerifier,
    KSeq,
    MaximalCoupling,
    MultiRound,
    OptimalVerifier,
    PriorityKeyVerifier,
    TopKVerifier,
    VerifierSpec,
    WithoutReplacementVerifier,
    get_verifier,
    greedy_draft_verifier,
    khisti_acceptance_one,
    khisti_alpha2,
    khisti_verifier,
    kseq,
    kseq_beta,
    kseq_p_acc,
    kseq_residual,
    kseq_rho_star,
    maximal_coupling,
    multiround,
    optimal_verifier,
    register_verifier,
    top_k_verifier,
    without_replacement_verifier,
)
from .otm import MinCut, OTMPlanVerifier, OTMResult, SolverError, alpha_k, min_cut, otm_lp, otm_lp_tuples

__version__ = "0.1.0"

__all__ = [
    "WithoutReplacementVerifier",
    "without_replacement_verifier",
    "GreedyDraftVerifier",
    "greedy_draft_verifier",
    "TopKVerifier",
    "top_k_verifier",
    "KhistiVerifier",
    "khisti_acceptance_one",
    "khisti_alpha2",
    "khisti_verifier",
    "EnsembleVerifier",
    "ensemble_verifier",
    "TypicalAcceptanceVerifier",
    "typical_acceptance_verifier",
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
    "PriorityKeyVerifier",
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
    "tree",
    "validate_model",
    "validate_model_pair",
]

#: Subpackages with heavy optional dependencies, imported on first attribute access
#: (``otspec.decoding`` needs torch, ``otspec.plotting`` matplotlib); ``import otspec`` imports neither.
_LAZY_SUBMODULES = ("decoding", "plotting")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
