r"""Property-based validity testing of any speculative-sampling implementation.

:func:`check_sampler` certifies or refutes that a token-level ``step``
(k drafts from ``p`` in, one token out) is lossless, i.e. that its output
follows the target ``q``; :func:`check_block_sampler` does the same for a
block verifier against a target model's joint law. Both choose their sample
size from the total variation to detect (:func:`sample_size`), can hand the
step boundary coins (:class:`BoundaryCoins`) to expose non-strict acceptance
tests, and report the first output outside the target's support.
:func:`chi2_gof` is the underlying Pearson test; :mod:`otspec.testing.strategies`
holds hypothesis strategies (needs the ``test`` extra).

Notation: ``p`` is the draft distribution, ``q`` the target, everywhere.
"""

from ._block import check_block_sampler
from ._chi2 import MAX_SAMPLES, GofResult, chi2_gof, detectable_tv, sample_size
from ._coins import BOUNDARY_FRACTION, BoundaryCoins
from ._logits import processed_law
from ._sampler import (
    CHUNK,
    TRIAL_BUDGET,
    WORST_CELLS,
    CellResidual,
    SamplerCheck,
    StepError,
    Violation,
    check_sampler,
    seed_for,
)

__all__ = [
    "BOUNDARY_FRACTION",
    "CHUNK",
    "MAX_SAMPLES",
    "TRIAL_BUDGET",
    "WORST_CELLS",
    "BoundaryCoins",
    "CellResidual",
    "GofResult",
    "SamplerCheck",
    "StepError",
    "Violation",
    "check_block_sampler",
    "check_sampler",
    "chi2_gof",
    "detectable_tv",
    "processed_law",
    "sample_size",
    "seed_for",
]
