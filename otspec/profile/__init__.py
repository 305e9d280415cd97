r"""Profile a draft/target pair: every verifier's exact acceptance on the same contexts, stored and summarised.

At contexts along a path (target samples, or given reference text) the
profile draws ``k_max`` i.i.d. draft blocks of length ``L_max``, scores the
tree with one target call, and records, exactly from those laws, every
token-level verifier's acceptance per depth and every scheme's expected
accepted tokens for each ``k <= k_max`` and ``L <= L_max``. Runs stream to
Parquet shards with a JSON manifest (resumable); :func:`summarize` gives
tokens per target call with bootstrap intervals, paired differences and
predicted speed-ups; :func:`write_report` a markdown report with figures.
With ``trees=``, draft-tree families (static top-k shapes, EAGLE-2, i.i.d. and
without-replacement trees) are drafted and scored on the same contexts, and
the summary chooses a tree on half the prompts and measures it on the other
half (docs/guide/trees_profile.rst).
What a profile's average estimates about real decoding, and the unbiased
renewal estimator along the text (:func:`emission_probs`,
:func:`tokens_per_call`), are in ``docs/theory/profile.rst``.

Needs the decoding extra (torch) and ``pip install 'otspec-verifiers[profile]'``
(pyarrow, tqdm); ``otspec-verifiers[distributed]`` adds dask for runs over a
cluster (from a clone: ``pip install -e '.[decoding,profile]'``).
See docs/guide/profile.rst.

Notation: ``p`` is the draft model's next-token law, ``q`` the target's.
"""

from ._figures import (
    plot_acceptance_vs_k,
    plot_chosen_tree,
    plot_speedup,
    plot_tokens_vs_L,
    plot_tree_speedup,
    plot_tree_tokens,
)
from ._prompts import load_prompts
from ._renewal import (
    RENEWAL_SCHEMES,
    RenewalEstimate,
    emission_probs,
    emission_probs_along,
    emission_probs_from_token_probs,
    palm_tokens_per_call,
    per_position_tokens_per_call,
    starts_recursion,
    tokens_per_call,
)
from ._report import write_report
from ._run import ProfileRun, profile
from ._settings import ProfileSettings
from ._store import read_manifest, read_table
from ._summary import (
    MIN_RANKED_POSITIONS,
    Configuration,
    Costs,
    Estimate,
    PositionSet,
    ProfileSummary,
    Recommendation,
    SequoiaShape,
    StaticShape,
    TreeBoundSummary,
    TreeChoice,
    TreeSummary,
    summarize,
)
from ._toy import toy_pair

__all__ = [
    "MIN_RANKED_POSITIONS",
    "Configuration",
    "Costs",
    "PositionSet",
    "Recommendation",
    "RENEWAL_SCHEMES",
    "Estimate",
    "ProfileRun",
    "ProfileSettings",
    "ProfileSummary",
    "RenewalEstimate",
    "SequoiaShape",
    "StaticShape",
    "TreeBoundSummary",
    "TreeChoice",
    "TreeSummary",
    "emission_probs",
    "emission_probs_along",
    "emission_probs_from_token_probs",
    "load_prompts",
    "palm_tokens_per_call",
    "per_position_tokens_per_call",
    "plot_acceptance_vs_k",
    "plot_chosen_tree",
    "plot_speedup",
    "plot_tokens_vs_L",
    "plot_tree_speedup",
    "plot_tree_tokens",
    "profile",
    "read_manifest",
    "read_table",
    "starts_recursion",
    "summarize",
    "tokens_per_call",
    "toy_pair",
    "write_report",
]
