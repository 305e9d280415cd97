r"""Prompts of a profile: token ids from a list, a JSONL file or a ``datasets.Dataset``.

Two steps: :func:`read_prompts` parses every record and checks what needs
neither a vocabulary nor a tokenizer (JSON syntax, keys, types, non-empty
prompts), so a command line can report a bad line before loading any model;
:func:`load_prompts` then checks the token ids against the vocabulary and
tokenises text prompts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

from .._validation import validate_positive_int
from ..decoding._models import validate_prompt

__all__ = ["load_prompts", "read_prompts", "has_text", "PromptRecord"]

#: Keys read from a JSONL line or a dataset row: token ids first, then text (needs a tokenizer).
ID_KEYS = ("input_ids", "prompt_ids", "ids")
TEXT_KEYS = ("prompt", "text")
REF_ID_KEYS = ("reference_ids",)
REF_TEXT_KEYS = ("reference", "completion")
#: Stands for "any vocabulary" while the vocabulary is not known yet (ids are checked to be >= 0 only).
_ANY = 2**63


class PromptRecord(NamedTuple):
    """One prompt as read, before the vocabulary is known: token ids (list of int) or text (str) each."""

    where: str
    prompt: list | str
    reference: list | str | None


def _ids(x, V, where: str) -> list[int]:
    try:
        return validate_prompt(x, _ANY if V is None else V, "prompt")
    except (TypeError, ValueError) as exc:
        msg = str(exc).replace(f"in [0, {_ANY})", ">= 0")
        raise type(exc)(f"{where}: {msg}") from None


def _text(x, key: str, where: str) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{where}: {key!r} must be a string, got {type(x).__name__}")
    if not x:
        raise ValueError(f"{where}: {key!r} must be non-empty text, got ''")
    return x


def _record(rec, where: str, need_reference: bool) -> PromptRecord:
    """One JSONL line / dataset row / list item, checked without a vocabulary or a tokenizer."""
    if isinstance(rec, str):
        return PromptRecord(where, _text(rec, "prompt", where), None)
    if not isinstance(rec, dict):
        return PromptRecord(where, _ids(rec, None, where), None)
    prompt = ref = None
    for key in ID_KEYS:
        if key in rec:
            where = f"{where} ({key!r})"  # the range of the ids is checked later: name the key then too
            prompt = _ids(rec[key], None, where)
            break
    else:
        for key in TEXT_KEYS:
            if key in rec:
                prompt = _text(rec[key], key, where)
                break
    if prompt is None:
        raise ValueError(f"{where} has none of the keys {ID_KEYS + TEXT_KEYS}, got keys {sorted(rec)}")
    for key in REF_ID_KEYS:
        if key in rec:
            ref = _ids(rec[key], None, f"{where} ({key!r})")
    for key in REF_TEXT_KEYS:
        if ref is None and key in rec:
            ref = _text(rec[key], key, where)
    if need_reference and ref is None:
        raise ValueError(f"{where} has no reference text ({REF_ID_KEYS + REF_TEXT_KEYS}), needed by context='reference'")
    return PromptRecord(where, prompt, ref)


def read_prompts(prompts, *, context: str = "sample") -> list[PromptRecord]:
    r"""Every prompt of a source, parsed and checked before any model or tokenizer is loaded.

    .. math::

        \text{source} \mapsto \big((x^{(i)}, r^{(i)})\big)_{i = 1..N},
        \quad x^{(i)} \text{ token ids } (\ge 0) \text{ or non-empty text}.

    Checks the JSON syntax of every line, the keys, the types and that no
    prompt is empty; the range of the token ids needs the vocabulary and is
    checked by :func:`load_prompts`.

    Parameters
    ----------
    prompts : list, str or path, or datasets.Dataset
        As :func:`load_prompts`.
    context : {"sample", "reference"}
        ``"reference"`` requires a reference continuation per prompt.

    Returns
    -------
    list of PromptRecord
        ``(where, prompt, reference)``: where it was read (a file's line,
        a list's index), the prompt's ids or text, the reference's or None.

    Raises
    ------
    ValueError
        A bad JSONL line (its number is named), no prompts, an empty prompt,
        a negative id, a missing reference.
    TypeError
        An unsupported source, a record of the wrong type.

    Examples
    --------
    >>> from otspec.profile._prompts import read_prompts
    >>> [(r.prompt, r.reference) for r in read_prompts([[1, 2], {"prompt": "Hi"}])]
    [([1, 2], None), ('Hi', None)]
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
                out.append(_record(rec, where, need_ref))
    elif type(prompts).__name__ in ("Dataset", "IterableDataset") and hasattr(prompts, "column_names"):
        for n, rec in enumerate(prompts):
            out.append(_record(dict(rec), f"`prompts` dataset row {n}", need_ref))
    else:
        try:
            items = list(prompts)
        except TypeError as exc:
            raise TypeError(
                f"`prompts` must be a list, a JSONL path or a datasets.Dataset, got {type(prompts).__name__}"
            ) from exc
        for n, rec in enumerate(items):
            out.append(_record(rec, f"`prompts[{n}]`", need_ref))
    if not out:
        raise ValueError("`prompts` must hold at least one prompt, got none")
    return out


def has_text(records: list[PromptRecord]) -> bool:
    """Whether any prompt or reference of :func:`read_prompts`'s records is text (needs a tokenizer)."""
    return any(isinstance(r.prompt, str) or isinstance(r.reference, str) for r in records)


def _check_tokenizer(tokenizer, chat_template: bool) -> None:
    if not callable(tokenizer):
        raise TypeError(f"`tokenizer` must be callable as tokenizer(text)['input_ids'], got {type(tokenizer).__name__}")
    if chat_template and (not callable(getattr(tokenizer, "apply_chat_template", None))
                          or not getattr(tokenizer, "chat_template", None)):
        raise ValueError(f"`chat_template=True` needs a tokenizer with a chat template (its apply_chat_template and "
                         f"chat_template), got a {type(tokenizer).__name__} without one")


def _encode(text: str, tokenizer, where: str, chat: bool) -> list:
    if tokenizer is None:
        raise TypeError(f"{where} is text ({text[:30]!r}...): pass `tokenizer=` (or token ids)")
    if chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def load_prompts(prompts, vocab_size: int, *, tokenizer=None, context: str = "sample",
                 chat_template: bool = False) -> list[tuple]:
    r"""Prompts (and reference continuations) as token ids, checked before any model call.

    .. math::

        \text{source} \mapsto \big((x^{(i)}_{1..T_i}, r^{(i)})\big)_{i = 1..N}, \quad x_t \in [0, V).

    Text is tokenised raw: ``tokenizer(text, add_special_tokens=False)``, no
    special tokens and no chat template. With ``chat_template=True`` a text
    prompt becomes the conversation of one user message, tokenised by
    ``tokenizer.apply_chat_template([{"role": "user", "content": text}],
    add_generation_prompt=True)`` (the model's own chat format, ending with
    the assistant's turn); reference texts, continuations of the prompt,
    stay raw.

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
    chat_template : bool, keyword-only
        Apply the tokenizer's chat template to text prompts (default: raw text).

    Returns
    -------
    list of (list of int, list of int or None)

    Raises
    ------
    ValueError
        A bad JSONL line (its number is named), no prompts, ids out of range,
        a missing reference, ``chat_template=True`` with a tokenizer without
        a chat template.
    TypeError
        Text without a tokenizer, an unsupported source.

    Examples
    --------
    >>> from otspec.profile import load_prompts
    >>> load_prompts([[1, 2], [3]], 5)
    [([1, 2], None), ([3], None)]
    """
    vocab_size = validate_positive_int(vocab_size, "vocab_size")  # "x": a comparison error per token
    if not isinstance(chat_template, bool):
        raise TypeError(f"`chat_template` must be a bool, got {type(chat_template).__name__}")
    records = read_prompts(prompts, context=context)
    if tokenizer is not None and has_text(records):
        _check_tokenizer(tokenizer, chat_template)
    out = []
    for where, prompt, ref in records:
        if isinstance(prompt, str):
            prompt = _encode(prompt, tokenizer, where, chat_template)
        if isinstance(ref, str):
            ref = _encode(ref, tokenizer, where, False)
        out.append((_ids(prompt, vocab_size, where), None if ref is None else _ids(ref, vocab_size, where)))
    return out
