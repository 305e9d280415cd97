r"""Prompts of a profile: token ids from a list, a JSONL file or a ``datasets.Dataset``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..decoding._models import validate_prompt

__all__ = ["load_prompts"]

#: Keys read from a JSONL line or a dataset row: token ids first, then text (needs a tokenizer).
ID_KEYS = ("input_ids", "prompt_ids", "ids")
TEXT_KEYS = ("prompt", "text")
REF_ID_KEYS = ("reference_ids",)
REF_TEXT_KEYS = ("reference", "completion")


def _encode(text: str, tokenizer, where: str) -> list[int]:
    if tokenizer is None:
        raise TypeError(f"{where} is text ({text[:30]!r}...): pass `tokenizer=` (or token ids)")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if callable(tokenizer) else None
    if ids is None:
        raise TypeError(f"`tokenizer` must be callable as tokenizer(text)['input_ids'], got {type(tokenizer).__name__}")
    return list(ids)


def _ids(x, V: int, where: str) -> list[int]:
    try:
        return validate_prompt(x, V, "prompt")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _record(rec, V: int, tokenizer, where: str, need_reference: bool):
    """(prompt ids, reference ids or None) of one JSONL line / dataset row / list item."""
    if isinstance(rec, str):
        return _ids(_encode(rec, tokenizer, where), V, where), None
    if not isinstance(rec, dict):
        return _ids(rec, V, where), None
    prompt = ref = None
    for key in ID_KEYS:
        if key in rec:
            prompt = _ids(rec[key], V, f"{where} ({key!r})")
            break
    else:
        for key in TEXT_KEYS:
            if key in rec:
                if not isinstance(rec[key], str):
                    raise TypeError(f"{where}: {key!r} must be a string, got {type(rec[key]).__name__}")
                prompt = _ids(_encode(rec[key], tokenizer, where), V, where)
                break
    if prompt is None:
        raise ValueError(f"{where} has none of the keys {ID_KEYS + TEXT_KEYS}, got keys {sorted(rec)}")
    for key in REF_ID_KEYS:
        if key in rec:
            ref = _ids(rec[key], V, f"{where} ({key!r})")
    for key in REF_TEXT_KEYS:
        if ref is None and key in rec:
            ref = _ids(_encode(rec[key], tokenizer, where), V, where)
    if need_reference and ref is None:
        raise ValueError(f"{where} has no reference text ({REF_ID_KEYS + REF_TEXT_KEYS}), needed by context='reference'")
    return prompt, ref


def load_prompts(prompts, vocab_size: int, *, tokenizer=None, context: str = "sample") -> list[tuple]:
    r"""Prompts (and reference continuations) as token ids, checked before any model call.

    .. math::

        \text{source} \mapsto \big((x^{(i)}_{1..T_i}, r^{(i)})\big)_{i = 1..N}, \quad x_t \in [0, V).

    Parameters
    ----------
    prompts : list, str or path, or datasets.Dataset
        A list of token-id sequences, strings (need ``tokenizer``) or dicts;
        a path to a JSONL file, one JSON object per line with ``"input_ids"``
        (or ``"prompt"`` / ``"text"``) and, for ``context="reference"``,
        ``"reference_ids"`` (or ``"reference"`` / ``"completion"``); or a
        ``datasets.Dataset`` with those columns.
    vocab_size : int
        ``V``: every id must lie in ``[0, V)``.
    tokenizer : callable, optional
        ``tokenizer(text)["input_ids"]`` (a Hugging Face tokenizer).
    context : {"sample", "reference"}
        ``"reference"`` requires a reference continuation per prompt.

    Returns
    -------
    list of (list of int, list of int or None)

    Raises
    ------
    ValueError
        A bad JSONL line (its number is named), no prompts, ids out of range,
        a missing reference.
    TypeError
        Text without a tokenizer, an unsupported source.

    Examples
    --------
    >>> from otspec.profile import load_prompts
    >>> load_prompts([[1, 2], [3]], 5)
    [([1, 2], None), ([3], None)]
    """
    need_ref = context == "reference"
    out = []
    if isinstance(prompts, (str, os.PathLike)):
        path = Path(prompts)
        if not path.is_file():
            raise ValueError(f"`prompts` must be a JSONL file, a list or a datasets.Dataset; no file at {str(path)!r}")
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"`prompts` file {path.name}, line {n}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where} is not valid JSON ({exc.msg}, column {exc.colno})") from None
                out.append(_record(rec, vocab_size, tokenizer, where, need_ref))
    elif type(prompts).__name__ in ("Dataset", "IterableDataset") and hasattr(prompts, "column_names"):
        for n, rec in enumerate(prompts):
            out.append(_record(dict(rec), vocab_size, tokenizer, f"`prompts` dataset row {n}", need_ref))
    else:
        try:
            items = list(prompts)
        except TypeError as exc:
            raise TypeError(
                f"`prompts` must be a list, a JSONL path or a datasets.Dataset, got {type(prompts).__name__}"
            ) from exc
        for n, rec in enumerate(items):
            out.append(_record(rec, vocab_size, tokenizer, f"`prompts[{n}]`", need_ref))
    if not out:
        raise ValueError("`prompts` must hold at least one prompt, got none")
    return out
