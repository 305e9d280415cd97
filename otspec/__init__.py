"""otspec: exact optimal-transport analysis of speculative-decoding verifiers.

Notation everywhere: ``p`` is the draft (small model) distribution and ``q``
the target (large model) distribution.
"""

from . import closed_form
from ._validation import SIMPLEX_TOL
from ._verifier import Verifier
from ._verifier import VerifierCheck
from ._verifier import check_verifier
from .alpha import MinCut
from .alpha import alpha_k
from .alpha import min_cut
from .closed_form import alpha_k_lower_bound
from .closed_form import alpha_k_upper_bound
from ._maximal_coupling import MaximalCoupling
from ._maximal_coupling import maximal_coupling
from ._otm_lp import OTMPlanVerifier
from ._otm_lp import OTMResult
from ._otm_lp import SolverError
from ._otm_lp import otm_lp
from ._otm_lp import otm_lp_tuples

# --- section: multidraft (k-Seq, multi-round) ---
from ._kseq import KSeq
from ._kseq import kseq
from ._kseq import kseq_beta
from ._kseq import kseq_p_acc
from ._kseq import kseq_residual
from ._kseq import kseq_rho_star
from ._multiround import MultiRound
from ._multiround import multiround
# --- end section: multidraft ---

# --- section: optimal verifier ---
from ._optimal_verifier import OptimalVerifier
from ._optimal_verifier import optimal_verifier
# --- end section: optimal verifier ---

# --- section: block ---
from . import block
from . import models
from .models import Model
from .models import TableModel
from .models import MemorylessModel
from .models import MarkovModel
from .models import random_table_model
from .models import random_markov_model
from .models import random_memoryless_model
from .models import sequence_probability
from .models import joint_law
from .models import conditional_tables
from .models import validate_model
from .models import validate_model_pair
# --- end section: block ---

# --- section: lossy (mentored, lenience, speculative economics) ---
from . import speculative
from ._mentored import MentoredFrontier
from ._mentored import MentoredResult
from ._mentored import MentoredVerifier
from ._mentored import mentored
from ._mentored import mentored_frontier
from ._mentored import mentored_verifier
from .lenience import LenienceCurve
from .lenience import LenientVerifier
from .lenience import lenience_curve
from .lenience import lenient_verifier
# --- end section: lossy ---

# --- section: spectr ---
from . import spectr
# --- end section: spectr ---

__version__ = "0.1.0"

__all__ = [
    "SIMPLEX_TOL",
    "MaximalCoupling",
    "MinCut",
    "OTMPlanVerifier",
    "OTMResult",
    "SolverError",
    "Verifier",
    "VerifierCheck",
    "alpha_k",
    "alpha_k_lower_bound",
    "alpha_k_upper_bound",
    "check_verifier",
    "closed_form",
    "maximal_coupling",
    "min_cut",
    "otm_lp",
    "otm_lp_tuples",
]

# --- __all__ section: multidraft ---
__all__ += ["KSeq", "MultiRound", "kseq", "kseq_beta", "kseq_p_acc", "kseq_residual", "kseq_rho_star", "multiround"]
# --- end __all__ section: multidraft ---
# --- __all__ section: optimal verifier ---
__all__ += ["OptimalVerifier", "optimal_verifier"]
# --- end __all__ section: optimal verifier ---
# --- __all__ section: block ---
__all__ += ["block", "models", "Model", "TableModel", "MemorylessModel", "MarkovModel", "random_table_model", "random_markov_model", "random_memoryless_model", "sequence_probability", "joint_law", "conditional_tables", "validate_model", "validate_model_pair"]
# --- end __all__ section: block ---
# --- __all__ section: lossy ---
__all__ += [
    "LenienceCurve",
    "LenientVerifier",
    "MentoredFrontier",
    "MentoredResult",
    "MentoredVerifier",
    "lenience_curve",
    "lenient_verifier",
    "mentored",
    "mentored_frontier",
    "mentored_verifier",
    "speculative",
]
# --- end __all__ section: lossy ---
# --- __all__ section: spectr ---
__all__ += ["spectr"]
# --- end __all__ section: spectr ---
