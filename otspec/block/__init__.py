r"""Block-level verification of a draft block of length ``L`` (Sun et al., arXiv:2403.10444).

A draft block :math:`X^L \sim M_s` (draft model, the package's ``p``) is
verified against a target model :math:`M_b` (``q``). Three verifiers:

* ``"token"`` -- :class:`TokenVerify`, per-token speculative sampling;
* ``"block"`` -- :class:`BlockVerify`, Sun et al.'s (arXiv:2403.10444) Algorithm 3 (backward
  acceptance with :math:`p_{\rm remain}/p_{\rm rej}` and a multi-token residual);
  it attains the block-OT optimum of Theorem 1;
* ``"block-onestep"`` -- :class:`BlockVerifyOneStep`, the published variant
  with a single correction token.

Lengths count accepted draft tokens :math:`\tau`; ``include_bonus=True``
counts :math:`\tau + 1` (Sun et al.'s (arXiv:2403.10444) sums from :math:`i = 0`).
"""

from ._analysis import (
    MAX_LP_VARIABLES,
    BlockCheck,
    BlockOTResult,
    bernoulli_block_length,
    bernoulli_token_length,
    check_lossless,
    expected_length,
    ot_optimum,
    theorem1_length,
    theorem2_length,
)
from ._multidraft import (
    MAX_EXACT_VARIABLES,
    MAX_MULTIDRAFT_VARIABLES,
    MultiDraftExact,
    MultiDraftOTResult,
    level_alphas,
    level_bound,
    multidraft_exact,
    multidraft_ot,
)
from ._multidraft_verifiers import (
    SCHEMES,
    MultiDraftPlanVerifier,
    MultiDraftSample,
    OneTokenResult,
    OneTokenVerifier,
    SchemeComparison,
    SchemeRow,
    compare_schemes,
    one_token_optimum,
)
from ._verifiers import (
    VERIFIERS,
    BlockSample,
    BlockStep,
    BlockVerifier,
    BlockVerify,
    BlockVerifyOneStep,
    TokenVerify,
    make_verifier,
    tau_law_on_path,
)

__all__ = [
    "MAX_EXACT_VARIABLES",
    "MAX_LP_VARIABLES",
    "MAX_MULTIDRAFT_VARIABLES",
    "MultiDraftExact",
    "MultiDraftPlanVerifier",
    "MultiDraftSample",
    "OneTokenResult",
    "OneTokenVerifier",
    "SCHEMES",
    "SchemeComparison",
    "SchemeRow",
    "compare_schemes",
    "one_token_optimum",
    "MultiDraftOTResult",
    "level_alphas",
    "level_bound",
    "multidraft_exact",
    "multidraft_ot",
    "VERIFIERS",
    "BlockCheck",
    "BlockOTResult",
    "BlockSample",
    "BlockStep",
    "BlockVerifier",
    "BlockVerify",
    "BlockVerifyOneStep",
    "TokenVerify",
    "bernoulli_block_length",
    "bernoulli_token_length",
    "check_lossless",
    "expected_length",
    "make_verifier",
    "tau_law_on_path",
    "ot_optimum",
    "theorem1_length",
    "theorem2_length",
]
