r"""Speculative decoding of real language models with the package's verifiers (optional: needs torch).

Not imported by ``import otspec``; use ``import otspec.decoding``. Install
the optional dependencies with ``pip install 'otspec-verifiers[decoding]'``.

Notation: ``p`` is the draft model's next-token law, ``q`` the target's.
"""

from ._deps import INSTALL_HINT
from ._deps import require as _require

_require("torch", "otspec.decoding")

from ._as_model import (
    LanguageModelLaws,  # noqa: E402
    as_model,  # noqa: E402
)
from ._loop import (
    BaselineResult,  # noqa: E402
    DecodeResult,  # noqa: E402
    autoregressive_decode,  # noqa: E402
    make_rng,  # noqa: E402
    speculative_decode,  # noqa: E402
)
from ._metrics import (
    DecodingCheck,  # noqa: E402
    DecodingSummary,  # noqa: E402
    check_lossless,  # noqa: E402
    exact_prefix_law,  # noqa: E402
    summarize,  # noqa: E402
)
from ._models import (
    CallableLM,  # noqa: E402
    HFCausalLM,  # noqa: E402
    LanguageModel,  # noqa: E402
    next_token_logits,  # noqa: E402
)
from ._sampling import (
    Sampling,  # noqa: E402
    transformers_keep_mask,  # noqa: E402
)
from ._verifiers import VERIFIER_NAMES  # noqa: E402
from .real import (
    layer_skip_draft,  # noqa: E402
    load_smollm2,  # noqa: E402
    smollm2_pair,  # noqa: E402
)

__all__ = [
    "INSTALL_HINT",
    "VERIFIER_NAMES",
    "BaselineResult",
    "CallableLM",
    "DecodeResult",
    "DecodingCheck",
    "DecodingSummary",
    "HFCausalLM",
    "LanguageModel",
    "LanguageModelLaws",
    "Sampling",
    "transformers_keep_mask",
    "as_model",
    "autoregressive_decode",
    "exact_prefix_law",
    "layer_skip_draft",
    "load_smollm2",
    "check_lossless",
    "make_rng",
    "next_token_logits",
    "smollm2_pair",
    "speculative_decode",
    "summarize",
]
