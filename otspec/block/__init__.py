r"""Block-level verification of a draft block of length ``L`` (seed: Optimal Block-Level Draft Verification).

A draft block :math:`X^L \sim M_s` (draft model, the package's ``p``) is
verified against a target model :math:`M_b` (``q``). Three verifiers:

* ``"token"`` -- :class:`TokenVerify`, per-token speculative sampling;
* ``"block"`` -- :class:`BlockVerify`, the seed's Algorithm 3 (backward
  acceptance with :math:`p_{\rm remain}/p_{\rm rej}` and a multi-token residual);
  it attains the block-OT optimum of Theorem 1;
* ``"block-onestep"`` -- :class:`BlockVerifyOneStep`, the published variant
  with a single correction token.

Lengths count accepted draft tokens :math:`\tau`; ``include_bonus=True``
counts :math:`\tau + 1` (the seed's sums from :math:`i = 0`).
"""

from ._analysis import MAX_LP_VARIABLES
from ._analysis import BlockOTResult
from ._analysis import bernoulli_block_length
from ._analysis import bernoulli_token_length
from ._analysis import check_lossless
from ._analysis import expected_length
from ._analysis import ot_optimum
from ._analysis import theorem1_length
from ._analysis import theorem2_length
from ._verifiers import VERIFIERS
from ._verifiers import BlockSample
from ._verifiers import BlockStep
from ._verifiers import BlockVerifier
from ._verifiers import BlockVerify
from ._verifiers import BlockVerifyOneStep
from ._verifiers import TokenVerify
from ._verifiers import make_verifier

__all__ = [
    "MAX_LP_VARIABLES",
    "VERIFIERS",
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
    "ot_optimum",
    "theorem1_length",
    "theorem2_length",
]
