r"""Property-based validity testing of any speculative-sampling implementation.

:func:`check_sampler` certifies or refutes that a token-level ``step``
(k drafts from ``p`` in, one token out) is lossless, i.e. that its output
follows the target ``q``; :func:`check_block_sampler` does the same for a
block verifier against a target model's joint law, and
:func:`check_tree_sampler` for a draft-tree verifier (with converters for
SGLang's tree arrays and kernel signature). Both choose their sample
size from the total variation to detect (:func:`sample_size`), can hand the
step boundary coins (:class:`BoundaryCoins`) to expose non-strict acceptance
tests, and report the first output outside the target's support.
:func:`chi2_gof` is the underlying Pearson test; :mod:`otspec.testing.strategies`
holds hypothesis strategies (needs the ``test`` extra).

Notation: ``p`` is the draft distribution, ``q`` the target, everywhere.
"""

from ._block import check_block_sampler
from ._chi2 import MAX_SAMPLES, MAX_UNIFORM_CELLS, GofResult, chi2_gof, detectable_tv, sample_size
from ._coins import BOUNDARY_FRACTION, BoundaryCoins
from ._logits import processed_law
from ._sampler import (
    CHUNK,
    MAX_HARNESS_DRAFTS,
    TRIAL_BUDGET,
    WORST_CELLS,
    CellResidual,
    SamplerCheck,
    StepError,
    Violation,
    check_sampler,
    seed_for,
)
from ._tree import (
    MAX_HARNESS_TREES,
    TreeSamplerCheck,
    check_tree_sampler,
    from_sglang_kernel,
    sglang_tree_arrays,
    tree_from_sglang,
)

__all__ = [
    "BOUNDARY_FRACTION",
    "CHUNK",
    "MAX_HARNESS_DRAFTS",
    "MAX_HARNESS_TREES",
    "MAX_SAMPLES",
    "MAX_UNIFORM_CELLS",
    "TRIAL_BUDGET",
    "WORST_CELLS",
    "BoundaryCoins",
    "CellResidual",
    "GofResult",
    "SamplerCheck",
    "StepError",
    "TreeSamplerCheck",
    "Violation",
    "check_block_sampler",
    "check_sampler",
    "check_tree_sampler",
    "chi2_gof",
    "detectable_tv",
    "from_sglang_kernel",
    "processed_law",
    "sample_size",
    "seed_for",
    "sglang_tree_arrays",
    "tree_from_sglang",
]
