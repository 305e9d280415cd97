"""Audit of the input handling of every public entry point (task BX): bad input gets a clear error, never a
wrong answer.

Table-driven: each public callable that takes a law (``p``, ``q``, ``law``, ``dist``, ...) or another array
(acceptance vectors, logits, counts, token ids, the renewal estimators' ``e``/``m``/``r``) is called with a
catalogue of foreign and odd inputs built from one reference input, and with odd integer/option arguments.
Every call must end in one of two ways:

* the reference answer (the one of the float64 C-contiguous numpy input) to 1e-12. Rule for lower-precision
  input: the answer is that of the input's own values read exactly in float64 (and, for a law, rescaled to sum
  to 1); the reference laws below are dyadic, so float32 and float16 hold them exactly and the answer is the
  reference itself. ``-0.0`` counts as ``+0.0`` and a subnormal entry of a law as 0 (flushed on input);
* a ``ValueError`` / ``TypeError`` whose message names the parameter in backticks and says what came.

Never: a wrong answer, another exception from deep inside (numba, IndexError, AttributeError, RuntimeError,
...), a warning, or a changed input (the inputs' bytes, dtype, flags, mask and grad state are compared before
and after each call). Kinds marked ``either`` may be accepted or refused (a one-hot of ints, extra
singleton axes, a 0-d array, a torch tensor next to a numpy array, a dask array); when accepted they must give
the answer of the same values as a float64 array. A law of booleans is refused on every route (task CB: it
was accepted on the 1-D route and refused on the batched one).

Findings on main c85c2d0 (each failed there; the table's rows and the regressions at the end fail on it):
masked entries read through (the mask dropped), batched routes turning ``-0.0`` into a wrong value and
subnormals into an overflow warning, dask arrays crashing inside the batched routes, ``kl_divergence``
without any validation (NaN gave ``inf``, lists an IndexError), ``expected_acceptance`` and the array
arguments of ``speculative``, ``sequoia``, ``lenience_curve``, ``mentored_frontier``, ``kseq_beta``,
``uncovered_prefixes``, ``emission_probs_from_token_probs`` and the renewal estimators parsing text, dropping
imaginary parts with a ComplexWarning and crashing on torch tensors with ``requires_grad``;
``joint_from_tables`` multiplying NaN through; ``expected_tokens(a, 2**63)`` = ``-inf`` with an overflow
warning; ``block_efficiency_mc(n_samples=2**63)`` and ``acceptance_vector(width=2**63)`` running without end;
``chi2_gof(min_expected=None)`` a bare comparison TypeError; token ids with ``inf`` a numpy warning;
``otm_lp_tuples`` printing HiGHS's banner at the first LP of a process; float128 beyond the float64 range an
overflow warning.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import otspec
import otspec.block as blk
import otspec.profile as prof
import otspec.spectr as spt
from otspec import closed_form as cf
from otspec import lossy, models, otm, speculative, testing, tree
from otspec import multidraft as md

torch = pytest.importorskip("torch")

P = np.array([0.5, 0.25, 0.125, 0.125, 0.0])  # dyadic: float32 and float16 hold them exactly
Q = np.array([0.125, 0.25, 0.5, 0.0, 0.125])
COUNTS = [130, 240, 510, 0, 120]

# ---------------------------------------------------------------------------------------------------------
# the catalogue of inputs
# ---------------------------------------------------------------------------------------------------------


def _set(x, i, v):
    y = np.array(x, dtype=np.float64)
    y.reshape(-1)[i] = v
    return y


def _strided(x):
    big = np.zeros((2 * x.shape[0],) + x.shape[1:], dtype=x.dtype)
    big[::2] = x
    return big[::2]


def _readonly(x):
    a = x.copy()
    a.flags.writeable = False
    return a


def _torch_strided(x):
    t = torch.zeros((2 * x.shape[0],) + x.shape[1:], dtype=torch.float64)
    t[::2] = torch.as_tensor(x, dtype=torch.float64)
    return t[::2]


def _masked_one(x):
    m = np.zeros(x.shape, dtype=bool)
    m.reshape(-1)[0] = True
    return np.ma.masked_array(x, mask=m)


def _negative(x):
    """Mass moved from a zero entry to the first: still sums to 1, one entry negative."""
    y = np.array(x, dtype=np.float64)
    i = int(np.argmin(y))
    y.reshape(-1)[i] -= 0.0625
    y.reshape(-1)[0] += 0.0625
    return y


def _zero_entry(x, v):
    y = np.array(x, dtype=np.float64)
    y.reshape(-1)[int(np.argmin(y))] = v
    return y


def _object_with_text(x):
    y = np.array(x, dtype=object)
    y.reshape(-1)[-1] = "a"
    return y


def _dask(x):
    da = pytest.importorskip("dask.array")
    return da.from_array(x)


def _pandas(x):
    pd = pytest.importorskip("pandas")
    return pd.Series(x) if x.ndim == 1 else pd.DataFrame(x) if x.ndim == 2 else x.tolist()


# (name, transform of the reference law, expectation): "same" the reference answer, "either" the reference
# answer of np.asarray(value, float64) or a named error, "refused" a named error
LAW_KINDS = [
    ("list", lambda x: x.tolist(), "same"),
    ("tuple", lambda x: tuple(x.tolist()), "same"),
    ("float32", lambda x: x.astype(np.float32), "same"),
    ("float16", lambda x: x.astype(np.float16), "same"),
    ("longdouble", lambda x: x.astype(np.longdouble), "same"),
    ("object-floats", lambda x: x.astype(object), "same"),
    ("strided", _strided, "same"),
    ("fortran-column-view", lambda x: np.asfortranarray(np.stack([x, x], axis=1))[:, 1], "same"),
    ("readonly", _readonly, "same"),
    ("torch-float64", lambda x: torch.tensor(x), "either"),
    ("torch-float32", lambda x: torch.tensor(x, dtype=torch.float32), "either"),
    ("torch-grad", lambda x: torch.tensor(x, requires_grad=True), "either"),
    ("torch-strided", _torch_strided, "either"),
    ("dask", _dask, "either"),
    ("pandas", _pandas, "either"),
    ("masked-none", lambda x: np.ma.masked_array(x, mask=np.zeros(x.shape, bool)), "same"),
    ("memoryview", lambda x: memoryview(x.copy()), "either"),
    ("int-one-hot", lambda x: (x == x.max()).astype(np.int64), "either"),
    ("bool-one-hot", lambda x: x == x.max(), "refused"),  # no probability vector: refused on every route
    ("row-2d", lambda x: x[None, :], "either"),
    ("column-2d", lambda x: x[:, None], "either"),
    ("0-d", lambda x: np.float64(x.flat[0]), "either"),
    ("negative-zero", lambda x: _zero_entry(x, -0.0), "same"),
    ("subnormal", lambda x: _zero_entry(x, 5e-324), "same"),
    ("off-by-1e-13", lambda x: _set(x, 0, x.flat[0] + 1e-13), "near"),
    ("empty", lambda x: np.array([]), "refused"),
    ("nan", lambda x: _set(x, 0, np.nan), "refused"),
    ("+inf", lambda x: _set(x, 0, np.inf), "refused"),
    ("-inf", lambda x: _set(x, 0, -np.inf), "refused"),
    ("negative", _negative, "refused"),
    ("off-by-1e-6", lambda x: _set(x, 0, x.flat[0] + 1e-6), "refused"),
    ("float128-overflow", lambda x: _set(x, 0, 1.0).astype(np.longdouble) * np.longdouble(2) ** 1100, "refused"),
    ("complex", lambda x: x.astype(complex), "refused"),
    ("str-dtype", lambda x: x.astype(str), "refused"),
    ("list-of-str", lambda x: [str(v) for v in x], "refused"),
    ("object-str", _object_with_text, "refused"),
    ("None", lambda x: None, "refused"),
    ("ragged", lambda x: [x[:2].tolist(), x[2:].tolist()], "refused"),
    ("masked-entry", _masked_one, "refused"),
    ("str", lambda x: "0.5", "refused"),
    ("dict", lambda x: {0: 1.0}, "refused"),
]

# ---------------------------------------------------------------------------------------------------------
# what a call did
# ---------------------------------------------------------------------------------------------------------


def _state(x):
    """What the caller can see of ``x``."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, tuple(x.shape), x.stride(), x.detach().tolist(), x.requires_grad, x.grad)
    if isinstance(x, np.ma.MaskedArray):
        return ("masked", x.data.tobytes(), np.ma.getmaskarray(x).tobytes(), x.flags.writeable)
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype, x.shape, x.strides, x.tobytes(), x.flags.writeable, x.flags.owndata)
    if type(x).__module__.startswith("dask"):
        return ("dask", np.asarray(x).tobytes())
    if type(x).__module__.startswith("pandas"):
        return ("pandas", x.to_numpy().tobytes(), x.index.tolist())
    if isinstance(x, memoryview):
        return ("memoryview", bytes(x))
    try:
        return pickle.dumps(x)
    except (pickle.PicklingError, AttributeError, TypeError):
        return ("object", id(x), repr(vars(x)) if hasattr(x, "__dict__") else repr(x))


def _numbers(r):
    """The numbers of a result, flat (verifiers by their acceptance and output law, dataclasses by their
    numeric fields)."""
    if isinstance(r, otspec.Verifier):
        return np.array([r.acceptance(), *np.ravel(r.output_law())])
    if hasattr(r, "__dataclass_fields__"):
        out = []
        for f in r.__dataclass_fields__:
            v = getattr(r, f)
            if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool):
                out.append(float(v))
            elif isinstance(v, np.ndarray) and v.dtype.kind in "fiu":
                out.extend(np.ravel(v).astype(float))
        return np.array(out)
    if isinstance(r, torch.Tensor):
        return r.detach().cpu().double().numpy().ravel()
    if isinstance(r, tuple) and r and not isinstance(r[0], (int, np.integer)):
        return np.concatenate([_numbers(x) for x in r])
    return np.asarray(r, dtype=np.float64).ravel()


def _outcome(fn, *args):
    """``("ok", numbers)`` or ``("error", exception)``; anything else (another exception, a warning) fails."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = ("ok", _numbers(fn(*args)))
        except (ValueError, TypeError) as exc:
            got = ("error", exc)
    msgs = [f"{w.category.__name__}: {w.message}" for w in caught]
    return got, msgs


def _check(fn, args, names, expect, ref, problems, label):
    """Call ``fn(*args)`` and append to ``problems`` what breaks the contract."""
    before = [_state(a) for a in args]
    try:
        (kind, val), msgs = _outcome(fn, *args)
    except Exception as exc:  # noqa: BLE001 - a crash from deep inside is the finding
        problems.append(f"{label}: crashed with {type(exc).__name__}: {str(exc)[:160]}")
        return
    if [_state(a) for a in args] != before:
        problems.append(f"{label}: changed its input")
    if msgs:
        problems.append(f"{label}: warned {msgs[:2]}")
    if kind == "error":
        text = str(val)
        if expect == "same":
            problems.append(f"{label}: refused an input it must accept: {type(val).__name__}: {text[:160]}")
        elif not any(f"`{n}" in text or re.search(rf"(?<![\w`]){re.escape(n)}(?![\w`])", text) for n in names):
            problems.append(f"{label}: error does not name {names}: {type(val).__name__}: {text[:160]}")
        return
    if expect == "refused":
        problems.append(f"{label}: accepted, gave {val[:4]}")
        return
    if ref is None:
        return
    rtol = 1e-9 if expect == "near" else 0.0
    if val.shape != ref.shape or not np.allclose(val, ref, rtol=rtol, atol=1e-12, equal_nan=True):
        problems.append(f"{label}: wrong answer {val[:5]} (expected {ref[:5]})")


def _reference(fn, *args):
    try:
        (kind, val), msgs = _outcome(fn, *args)
    except Exception:  # noqa: BLE001 - no reference: the accepted answer is not compared
        return None
    return val if kind == "ok" and not msgs else None


# ---------------------------------------------------------------------------------------------------------
# 1. functions of a (p, q) pair of laws
# ---------------------------------------------------------------------------------------------------------

PAIR_FUNCTIONS = {
    "alpha_k": lambda p, q: otspec.alpha_k(p, q, 2),
    "alpha_k(replacement=False)": lambda p, q: otspec.alpha_k(p, q, 2, replacement=False),
    "alpha_k_lower_bound": lambda p, q: otspec.alpha_k_lower_bound(p, q, 2),
    "alpha_k_upper_bound": lambda p, q: otspec.alpha_k_upper_bound(p, q, 2),
    "khisti_acceptance_one": lambda p, q: otspec.khisti_acceptance_one(p, q),
    "khisti_alpha2": lambda p, q: otspec.khisti_alpha2(p, q),
    "kseq_beta": lambda p, q: otspec.kseq_beta(p, q, 0.5),
    "kseq_p_acc": lambda p, q: otspec.kseq_p_acc(p, q, 2, 0.5),
    "kseq_residual": lambda p, q: otspec.kseq_residual(p, q, 2),
    "kseq_rho_star": lambda p, q: otspec.kseq_rho_star(p, q, 2),
    "lenience_curve": lambda p, q: otspec.lenience_curve(p, q, [0.5, 1.0]),
    "mentored": lambda p, q: otspec.mentored(p, q, 0.1),
    "mentored_frontier": lambda p, q: otspec.mentored_frontier(p, q, [0.1]),
    "min_cut": lambda p, q: otspec.min_cut(p, q, 2),
    "min_cut_without_replacement": lambda p, q: otm.min_cut_without_replacement(p, q, 2),
    "otm_lp": lambda p, q: otspec.otm_lp(p, q, 2),
    "otm_lp_tuples": lambda p, q: otspec.otm_lp_tuples(p, q, 2),
    "wor_lp": lambda p, q: otm.wor_lp(p, q, 2),
    "alpha_k_without_replacement": lambda p, q: otm.alpha_k_without_replacement(p, q, 2),
    "maximal_coupling": lambda p, q: otspec.maximal_coupling(p, q),
    "kseq": lambda p, q: otspec.kseq(p, q, 2),
    "multiround": lambda p, q: otspec.multiround(p, q, 2),
    "optimal_verifier": lambda p, q: otspec.optimal_verifier(p, q, 2),
    "khisti_verifier": lambda p, q: otspec.khisti_verifier(p, q, 2),
    "greedy_draft_verifier": lambda p, q: otspec.greedy_draft_verifier(p, q, 2),
    "top_k_verifier": lambda p, q: otspec.top_k_verifier(p, q, 2),
    "without_replacement_verifier": lambda p, q: otspec.without_replacement_verifier(p, q, 2),
    "ensemble_verifier": lambda p, q: otspec.ensemble_verifier(p, q, 0.5),
    "typical_acceptance_verifier": lambda p, q: otspec.typical_acceptance_verifier(p, q),
    "lenient_verifier": lambda p, q: otspec.lenient_verifier(p, q, 0.5),
    "mentored_verifier": lambda p, q: otspec.mentored_verifier(p, q, 0.1),
    "batched_kseq_acceptance": lambda p, q: md.batched_kseq_acceptance(p, q, 2),
    "batched_kseq_rho_star": lambda p, q: md.batched_kseq_rho_star(p, q, 2),
    "batched_maximal_coupling_acceptance": lambda p, q: md.batched_maximal_coupling_acceptance(p, q),
    "expected_acceptance": lambda p, q: speculative.expected_acceptance(p, q),
    "spechub_optimum": lambda p, q: tree.spechub_optimum(p, q),
    "kl_divergence": lambda p, q: lossy.kl_divergence(q, p),  # KL(q || pi) with pi in the draft's place
    "block.expected_length(MemorylessModel)": lambda p, q: blk.expected_length(
        models.MemorylessModel(p), models.MemorylessModel(q), 2),
    "spectr.block_efficiency(MemorylessModel)": lambda p, q: spt.block_efficiency(
        models.MemorylessModel(p), models.MemorylessModel(q), 2, 2),
    "check_sampler": lambda p, q: testing.check_sampler(
        lambda drafts, rng: drafts[0], p, q, n_samples=400, rng=0).law,
}
# the name each function gives its two laws in its messages
PAIR_NAMES = {"kl_divergence": ("pi", "q"), "block.expected_length(MemorylessModel)": ("dist", "dist"),
              "spectr.block_efficiency(MemorylessModel)": ("dist", "dist")}
# batched routes take arrays only: a list or tuple is refused with a named TypeError
ARRAYS_ONLY = {"batched_kseq_acceptance", "batched_kseq_rho_star", "batched_maximal_coupling_acceptance"}
# kl_divergence reads its laws as given (no flush: its value is defined on the raw entries)
RAW_SUBNORMALS = {"kl_divergence"}


@pytest.mark.parametrize("name", list(PAIR_FUNCTIONS))
def test_pair_functions_take_the_catalogue(name):
    fn = PAIR_FUNCTIONS[name]
    names = PAIR_NAMES.get(name, ("p", "q"))
    ref = _numbers(fn(P, Q))
    problems = []
    for kind, make, expect in LAW_KINDS:
        if name in ARRAYS_ONLY and kind in ("list", "tuple", "object-floats"):
            expect = "either"
        if name in RAW_SUBNORMALS and kind == "subnormal":
            expect = "either"
        for which in ("p", "q", "both"):
            x = make(P if which != "q" else Q)
            args = {"p": (x, Q), "q": (P, x), "both": (x, make(Q))}[which]
            arg_names = {"p": names[:1], "q": names[1:], "both": names}[which]
            r = ref
            if expect == "either":  # the answer of the same values as float64 arrays, where that is a law pair
                plain = [np.array(np.asarray(a.detach() if isinstance(a, torch.Tensor) else a), dtype=np.float64)
                         for a in args]
                r = _reference(fn, *plain)
            _check(fn, args, arg_names, expect, r, problems, f"{name} {kind} ({which})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", list(PAIR_FUNCTIONS))
def test_pair_functions_on_one_token(name):
    """V = 1: both laws are the point mass; an answer or a named error, nothing else."""
    fn = PAIR_FUNCTIONS[name]
    problems = []
    _check(fn, (np.array([1.0]), np.array([1.0])), PAIR_NAMES.get(name, ("p", "q")) + ("k",), "either", None,
           problems, f"{name} V=1")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------
# 2. functions of one law, and of arrays that are not laws
# ---------------------------------------------------------------------------------------------------------

R3 = np.array([1.0, 0.5, 0.25])
E3 = np.array([[[1.0, 0.5, 0.25], [1.0, 0.25, 0.125], [1.0, 0.5, 0.0]]])  # (n_texts, T, L + 1)
LOG_Q = np.log(np.array([[0.5, 0.25, 0.5]]))

# name -> (function of the array, reference array, parameter name, kinds that must be refused beyond the
# law catalogue's text/None/ragged/complex/masked ones)
ARRAY_FUNCTIONS = {
    "set_weights": (lambda x: otm.set_weights(x, 2)[1], P, "p"),
    "wor_draft_prob": (lambda x: otm.wor_draft_prob(x, (0, 1)), P, "p"),
    "prob_within_without_replacement": (lambda x: otm.prob_within_without_replacement(x, (0, 1), 2), P, "p"),
    "spechub_pair_law": (lambda x: tree.spechub_pair_law(x), P, "p"),
    "chi2_gof.law": (lambda x: testing.chi2_gof(COUNTS, x), Q, "law"),
    "sample_size.law": (lambda x: testing.sample_size(0.05, x), Q, "law"),
    "detectable_tv.law": (lambda x: testing.detectable_tv(1000, x), Q, "law"),
    "MemorylessModel.dist": (lambda x: models.joint_law(models.MemorylessModel(x), 2), P, "dist"),
    "uncovered_prefixes.p_sorted": (lambda x: otm.uncovered_prefixes(x, 2), np.array([0.5, 0.25, 0.125, 0.125]),
                                    "p_sorted"),
    "sequoia.acceptance": (lambda x: tree.sequoia(x, 4, 3).value, np.array([0.5, 0.25, 0.125]), "acceptance"),
    "expected_tokens.alpha": (lambda x: speculative.expected_tokens(x, 3), np.array([0.5, 0.25]), "alpha"),
    "optimal_gamma.alpha": (lambda x: speculative.optimal_gamma(x, 0.25), np.array([0.5, 0.75]), "alpha"),
    "lenience_curve.ls": (lambda x: otspec.lenience_curve(P, Q, x), np.array([0.5, 1.0]), "l"),
    "mentored_frontier.Ds": (lambda x: otspec.mentored_frontier(P, Q, x), np.array([0.0, 0.5]), "Ds"),
    "kseq_beta.rho": (lambda x: otspec.kseq_beta(P, Q, x), np.array([2.0, 4.0]), "rho"),
    "processed_law.logits": (lambda x: testing.processed_law(x, temperature=0.5, top_k=3),
                             np.array([0.5, -1.0, 2.0, 0.25, -0.5]), "logits"),
    "emission_probs_from_token_probs.p_y": (
        lambda x: prof.emission_probs_from_token_probs("token", x, np.array([0.5, 0.25, 0.75]), L=2),
        np.array([0.25, 0.5, 0.125]), "p_y"),
    "tokens_per_call.e": (lambda x: prof.tokens_per_call(x, LOG_Q), E3, "e"),
    "tokens_per_call.log_q": (lambda x: prof.tokens_per_call(E3, x), LOG_Q, "log_q"),
    "starts_recursion.e": (lambda x: prof.starts_recursion(x, LOG_Q), E3, "e"),
    "per_position_tokens_per_call.m": (lambda x: prof.per_position_tokens_per_call(x), R3[None] + 1, "m"),
    "palm_tokens_per_call.m": (lambda x: prof.palm_tokens_per_call(x, R3[None]), R3[None] + 1, "m"),
    "palm_tokens_per_call.r": (lambda x: prof.palm_tokens_per_call(R3[None] + 1, x), R3[None], "r"),
    "joint_from_tables": (lambda x: models.joint_from_tables([np.array([0.5, 0.5]), x]),
                          np.array([[0.5, 0.5], [0.25, 0.75]]), "tables[1]"),
}
LAWS = {"set_weights", "wor_draft_prob", "prob_within_without_replacement", "spechub_pair_law", "chi2_gof.law",
        "sample_size.law", "detectable_tv.law", "MemorylessModel.dist"}
# for arrays that are not laws only these kinds have a fixed expectation; the rest may change the answer
ALWAYS_SAME = {"list", "tuple", "strided", "readonly", "masked-none", "fortran-column-view"}
ALWAYS_REFUSED = {"nan", "complex", "str-dtype", "list-of-str", "object-str", "None", "masked-entry", "str", "dict",
                  "float128-overflow"}


@pytest.mark.parametrize("name", list(ARRAY_FUNCTIONS))
def test_array_functions_take_the_catalogue(name):
    fn, x0, param = ARRAY_FUNCTIONS[name]
    ref = _numbers(fn(x0))
    problems = []
    for kind, make, expect in LAW_KINDS:
        if name not in LAWS:
            if kind == "ragged" and x0.ndim > 1:
                continue  # [[..], [..]] of a 2-D reference is no ragged nesting of it
            expect = "same" if kind in ALWAYS_SAME else "refused" if kind in ALWAYS_REFUSED else "either"
        if name == "processed_law.logits" and kind in ("+inf", "-inf"):
            expect = "either"  # -inf logits are masked tokens
        x = make(x0)
        r = ref
        if expect == "either":
            try:
                r = _reference(fn, np.array(np.asarray(x.detach() if isinstance(x, torch.Tensor) else x),
                                            dtype=np.float64))
            except (TypeError, ValueError):
                r = None
        _check(fn, (x,), (param,), expect, r, problems, f"{name} {kind}")
    assert not problems, "\n".join(problems)


INT_ARRAYS = {
    "expected_tokens.gamma": (lambda x: speculative.expected_tokens(0.5, x), np.array([1, 3]), "gamma"),
    "chi2_gof.counts": (lambda x: testing.chi2_gof(x, Q), np.array(COUNTS), "counts"),
    "sequence_probability.seq": (lambda x: models.sequence_probability(models.MemorylessModel(P), x),
                                 np.array([0, 1, 2]), "seq"),
    "wor_draft_prob.drafts": (lambda x: otm.wor_draft_prob(P, x), np.array([0, 1]), "drafts"),
    "Verifier.sample.drafts": (lambda x: otspec.kseq(P, Q, 2).sample(x, rng=0), np.array([0, 1]), "drafts"),
    "Verifier.conditional.drafts": (lambda x: otspec.kseq(P, Q, 2).conditional(x), np.array([0, 1]), "drafts"),
}
INT_KINDS = [
    ("list", lambda x: x.tolist(), "same"),
    ("tuple", lambda x: tuple(x.tolist()), "same"),
    ("int32", lambda x: x.astype(np.int32), "same"),
    ("uint16", lambda x: x.astype(np.uint16), "same"),
    ("strided", _strided, "same"),
    ("readonly", _readonly, "same"),
    ("torch", lambda x: torch.tensor(x), "either"),
    ("masked-entry", _masked_one, "refused"),
    ("float-nan", lambda x: _set(x, 0, np.nan), "refused"),
    ("float-inf", lambda x: _set(x, 0, np.inf), "refused"),
    ("float-fraction", lambda x: _set(x, 0, 0.5), "refused"),
    ("negative", lambda x: _set(x, 0, -1).astype(np.int64), "refused"),
    ("huge", lambda x: np.array([2**63] + x.tolist()[1:], dtype=object), "refused"),
    ("complex", lambda x: x.astype(complex), "refused"),
    ("str-dtype", lambda x: x.astype(str), "refused"),
    ("None", lambda x: None, "refused"),
    ("ragged", lambda x: [[0], [1, 2]], "refused"),
    ("str", lambda x: "01", "refused"),
]


@pytest.mark.parametrize("name", list(INT_ARRAYS))
def test_integer_arrays_take_the_catalogue(name):
    fn, x0, param = INT_ARRAYS[name]
    ref = _numbers(fn(x0))
    problems = []
    for kind, make, expect in INT_KINDS:
        _check(fn, (make(x0),), (param,), expect, ref if expect != "either" else ref, problems, f"{name} {kind}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------
# 3. integer and option arguments
# ---------------------------------------------------------------------------------------------------------

D4, T4 = models.MemorylessModel([0.5, 0.25, 0.125, 0.125]), models.MemorylessModel([0.125, 0.25, 0.5, 0.125])
SHAPE = tree.TreeShape([(0,), (1,), (0, 0)])

# name -> (function of the argument, a valid value, parameter name); the value's type decides the checks
OPTIONS = {
    "alpha_k.k": (lambda v: otspec.alpha_k(P, Q, v), 2, "k"),
    "alpha_k.method": (lambda v: otspec.alpha_k(P, Q, 2, method=v), "exact", "method"),
    "alpha_k(replacement=False).k": (lambda v: otspec.alpha_k(P, Q, v, replacement=False), 2, "k"),
    "alpha_k_lower_bound.k": (lambda v: otspec.alpha_k_lower_bound(P, Q, v), 2, "k"),
    "kseq_p_acc.k": (lambda v: otspec.kseq_p_acc(P, Q, v, 0.5), 2, "k"),
    "kseq_p_acc.rho": (lambda v: otspec.kseq_p_acc(P, Q, 2, v), 0.5, "rho"),
    "kseq_rho_star.k": (lambda v: otspec.kseq_rho_star(P, Q, v), 2, "k"),
    "min_cut.k": (lambda v: otspec.min_cut(P, Q, v), 2, "k"),
    "otm_lp.k": (lambda v: otspec.otm_lp(P, Q, v), 2, "k"),
    "wor_lp.k": (lambda v: otm.wor_lp(P, Q, v), 2, "k"),
    "kseq.k": (lambda v: otspec.kseq(P, Q, v), 2, "k"),
    "multiround.k": (lambda v: otspec.multiround(P, Q, v), 2, "k"),
    "optimal_verifier.k": (lambda v: otspec.optimal_verifier(P, Q, v), 2, "k"),
    "optimal_verifier.method": (lambda v: otspec.optimal_verifier(P, Q, 2, method=v), "keys", "method"),
    "khisti_verifier.k": (lambda v: otspec.khisti_verifier(P, Q, v), 2, "k"),
    "top_k_verifier.k": (lambda v: otspec.top_k_verifier(P, Q, v), 2, "k"),
    "ensemble_verifier.w": (lambda v: otspec.ensemble_verifier(P, Q, v), 0.5, "w"),
    "lenient_verifier.l": (lambda v: otspec.lenient_verifier(P, Q, v), 0.5, "l"),
    "mentored.D": (lambda v: otspec.mentored(P, Q, v), 0.1, "D"),
    "mentored.method": (lambda v: otspec.mentored(P, Q, 0.1, method=v), "exact", "method"),
    "mentored.max_iter": (lambda v: otspec.mentored(P, Q, 0.1, method="bisection", max_iter=v), 1100, "max_iter"),
    "batched_kseq_acceptance.k": (lambda v: md.batched_kseq_acceptance(P[None], Q[None], v), 2, "k"),
    "set_weights.k": (lambda v: otm.set_weights(P, v)[1], 2, "k"),
    "prob_within_without_replacement.k": (lambda v: otm.prob_within_without_replacement(P, (0, 1), v), 2, "k"),
    "bernoulli_alpha_k.k": (lambda v: cf.bernoulli_alpha_k(0.25, 0.5, v), 2, "k"),
    "uniform_alpha_k.d_p": (lambda v: cf.uniform_alpha_k(v, 5, 2), 3, "d_p"),
    "lemma3_constant.k": (lambda v: cf.lemma3_constant(v), 2, "k"),
    "expected_tokens.gamma": (lambda v: speculative.expected_tokens(0.5, v), 3, "gamma"),
    "optimal_gamma.max_gamma": (lambda v: speculative.optimal_gamma(0.5, 0.1, max_gamma=v), 1000, "max_gamma"),
    "random_memoryless_model.V": (lambda v: models.random_memoryless_model(v, rng=0).dist, 3, "V"),
    "random_memoryless_model.rng": (lambda v: models.random_memoryless_model(3, rng=v).dist, 3, "rng"),
    "random_table_model.max_len": (lambda v: models.joint_law(models.random_table_model(2, v, rng=0), 1), 2,
                                   "max_len"),
    "joint_law.length": (lambda v: models.joint_law(D4, v), 2, "length"),
    "block.expected_length.L": (lambda v: blk.expected_length(D4, T4, v), 2, "L"),
    "block.level_bound.k": (lambda v: blk.level_bound(D4, T4, 2, v), 2, "k"),
    "block.bernoulli_block_length.L": (lambda v: blk.bernoulli_block_length(0.25, 0.5, v), 3, "L"),
    "spectr.block_efficiency.k": (lambda v: spt.block_efficiency(D4, T4, v, 2), 2, "k"),
    "spectr.block_efficiency_mc.n_samples": (lambda v: spt.block_efficiency_mc(D4, T4, 2, 2, n_samples=v, rng=0),
                                             20, "n_samples"),
    "spectr.block_efficiency_mc.rng": (lambda v: spt.block_efficiency_mc(D4, T4, 2, 2, n_samples=20, rng=v), 1,
                                       "rng"),
    "tree.sequoia.n": (lambda v: tree.sequoia([0.5, 0.3, 0.1], v, 3).value, 4, "n"),
    "tree.best_shape.n": (lambda v: tree.best_shape(D4, T4, v).value, 3, "n"),
    "tree.acceptance_vector.width": (lambda v: tree.acceptance_vector(D4, T4, v), 2, "width"),
    "tree.bound.budget": (lambda v: tree.bound(SHAPE, D4, T4, process="iid", budget=v), 8, "budget"),
    "tree.sample_tree.rng": (lambda v: tree.sample_tree(SHAPE, D4, process="iid", rng=v).tokens, 3, "rng"),
    "testing.detectable_tv.n_samples": (lambda v: testing.detectable_tv(v, Q), 1000, "n_samples"),
    "testing.sample_size.tv": (lambda v: testing.sample_size(v, Q), 0.05, "tv"),
    "testing.chi2_gof.min_expected": (lambda v: testing.chi2_gof(COUNTS, Q, min_expected=v), 5.0, "min_expected",
                                      "expected count"),  # a huge min_expected: "too few samples" names the count
    "testing.chi2_gof.alpha_fail": (lambda v: testing.chi2_gof(COUNTS, Q, alpha_fail=v), 1e-4, "alpha_fail"),
    "testing.processed_law.top_k": (lambda v: testing.processed_law(np.log(Q + 1e-3), top_k=v), 2, "top_k"),
    "check_lossless.max_tuples": (lambda v: otspec.check_lossless(otspec.kseq(P, Q, 2), max_tuples=v), 1000,
                                  "max_tuples"),
    "Verifier.sample_drafts.rng": (lambda v: otspec.kseq(P, Q, 2).sample_drafts(rng=v), 3, "rng"),
}
# the values an integer argument meets: (label, value, expectation); "same" = the answer at the valid value
INT_VALUES = [("bool", True, "refused"), ("float", 2.0, "refused"), ("str", "2", "refused"),
              ("None", None, "either"), ("negative", -1, "refused"), ("zero", 0, "either"),
              ("2**63", 2**63, "either"), ("numpy-int", "numpy-int", "same"), ("list", [[2]], "either")]
REAL_VALUES = [("bool", True, "refused"), ("str", "0.5", "refused"), ("nan", float("nan"), "refused"),
               ("None", None, "either"), ("-inf", -float("inf"), "refused"), ("2**63", 2**63, "either"),
               ("numpy-float", "numpy-float", "same"), ("complex", 0.5 + 0j, "refused")]
STR_VALUES = [("unknown", "no-such-method", "refused"), ("None", None, "either"), ("int", 3, "refused"),
              ("bytes", b"exact", "refused")]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_options_take_odd_values(name):
    fn, good, *params = OPTIONS[name]
    ref = _numbers(fn(good))
    table = STR_VALUES if isinstance(good, str) else INT_VALUES if isinstance(good, int) else REAL_VALUES
    problems = []
    for label, v, expect in table:
        if name == "expected_tokens.gamma" and label == "float":
            expect = "either"  # an integral float (or float array) is read as the integer gamma
        if v == "numpy-int":
            v = np.int64(good)
        elif v == "numpy-float":
            v = np.float64(good)
        _check(fn, (v,), tuple(params), expect, ref if expect == "same" else None, problems, f"{name}={label}")
    assert not problems, "\n".join(problems)


def test_model_arguments_refuse_what_is_no_model():
    """A law, a string, None or a model of another vocabulary where a model goes: a named error."""
    calls = {
        "block.expected_length": lambda d, t: blk.expected_length(d, t, 2),
        "spectr.block_efficiency": lambda d, t: spt.block_efficiency(d, t, 2, 2),
        "tree.value": lambda d, t: tree.value(SHAPE, d, t, process="iid", verifier="specinfer"),
        "tree.bound": lambda d, t: tree.bound(SHAPE, d, t, process="iid"),
        "testing.check_block_sampler": lambda d, t: testing.check_block_sampler(
            lambda b, rng: (0,), d, t, 1, n_samples=300, rng=0),
    }

    class NanModel:
        vocab_size = 4

        def next_law(self, prefix):
            return np.array([np.nan, 0.5, 0.25, 0.25])

    bad = [None, "abc", np.array([0.25] * 4), 3, models.MemorylessModel([0.5, 0.5]), NanModel()]
    problems = []
    for name, fn in calls.items():
        for v in bad:
            for which, args in (("draft", (v, T4)), ("target", (D4, v))):
                _check(fn, args, (which, "model"), "refused", None, problems, f"{name} {which}={type(v).__name__}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------
# 4. regressions, one per root fix (each failed on main c85c2d0)
# ---------------------------------------------------------------------------------------------------------


def test_masked_entries_are_refused_not_read_through():
    """main: np.asarray dropped the mask and the hidden 0.5 was used."""
    p = np.ma.masked_array(P, mask=[True, False, False, False, False])
    with pytest.raises(ValueError, match=r"`p` must have no masked entries, got a masked array with 1 masked"):
        otspec.alpha_k(p, Q, 2)
    assert otspec.alpha_k(np.ma.masked_array(P), Q, 2) == otspec.alpha_k(P, Q, 2)  # no masked entry: the values


@pytest.mark.parametrize("tiny", [-0.0, 5e-324, 1e-310])
def test_batched_routes_flush_negative_zero_and_subnormals_as_the_1d_route(tiny):
    """main: -0.0 in p made q / p = -inf (a wrong acceptance), a subnormal an overflow warning."""
    p = P.copy()
    p[4] = tiny
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (md.batched_kseq_acceptance, md.batched_kseq_rho_star):
            got = fn(p[None], Q[None], 2)
            want = fn(P[None], Q[None], 2)
            np.testing.assert_array_equal(got, want)
            got_t = fn(torch.tensor(p[None]), torch.tensor(Q[None]), 2)
            np.testing.assert_array_equal(got_t.numpy(), want)
    assert p[4] == tiny and np.signbit(p[4]) == np.signbit(tiny)  # the caller's array untouched


def test_batched_routes_refuse_a_foreign_array_library_with_a_clear_error():
    """main: dask arrays crashed inside (AttributeError: no take_along_axis / __dlpack__)."""
    da = pytest.importorskip("dask.array")
    with pytest.raises(TypeError, match=r"`p` and `q` must be numpy arrays, torch tensors or cupy arrays"):
        md.batched_kseq_acceptance(da.from_array(P[None]), da.from_array(Q[None]), 2)


def test_kl_divergence_validates_its_laws():
    """main: no validation: NaN gave inf, a list an IndexError, lengths apart an IndexError."""
    with pytest.raises(ValueError, match="`q` must be finite"):
        lossy.kl_divergence(_set(Q, 0, np.nan), P)
    with pytest.raises(ValueError, match="`q` and `pi` must have the same length"):
        lossy.kl_divergence(Q, P[:4] / P[:4].sum())
    assert lossy.kl_divergence(Q.tolist(), tuple(Q)) == 0.0
    q = np.array([0.5, 0.5 - 1e-310, 1e-310])  # subnormal entries kept as given: the documented raw value
    assert np.isfinite(lossy.kl_divergence(np.array([0.5, 0.25, 0.25]), q))


def test_expected_acceptance_reads_tensors_and_refuses_complex():
    """main: a tensor with requires_grad raised RuntimeError; complex input a ComplexWarning and a value."""
    ref = speculative.expected_acceptance(P, Q)
    assert speculative.expected_acceptance(torch.tensor(P, requires_grad=True), torch.tensor(Q)) == ref
    with pytest.raises(TypeError, match="`p` must be real-valued"):
        speculative.expected_acceptance(P.astype(complex), Q)


def test_expected_tokens_at_a_huge_gamma():
    """main: gamma = 2**63 (a uint64) wrapped to a negative int64: -inf with an overflow warning."""
    with pytest.raises(ValueError, match=r"`gamma` must be an integer in \[1, 2\*\*63\)"):
        speculative.expected_tokens(0.5, 2**63)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert speculative.expected_tokens(0.5, 2**63 - 1) == 2.0  # sum of 0.5**i: 1 / (1 - 0.5)


def test_unbounded_loops_are_refused_before_they_start():
    """main: n_samples = 2**63 and width = 2**63 ran without end (a Python loop, a list of 2**63 nodes)."""
    with pytest.raises(ValueError, match="`n_samples` must be at most"):
        spt.block_efficiency_mc(D4, T4, 2, 2, n_samples=2**63, rng=0)
    with pytest.raises(ValueError, match="`width` must be at most MAX_TREE_NODES"):
        tree.acceptance_vector(D4, T4, 2**63)


@pytest.mark.parametrize("v, exc", [(None, TypeError), (float("nan"), ValueError), (0.0, ValueError)])
def test_chi2_min_expected_is_checked(v, exc):
    """main: None a bare '>=' TypeError, NaN a message about too few samples."""
    with pytest.raises(exc, match="`min_expected`"):
        testing.chi2_gof(COUNTS, Q, min_expected=v)


def test_text_and_complex_arrays_are_refused_where_arrays_are_not_laws():
    """main: np.asarray(x, dtype=float64) parsed '0.5' and dropped imaginary parts (with a ComplexWarning)."""
    with pytest.raises(TypeError, match="`acceptance`"):
        tree.sequoia(np.array(["0.5", "0.25"]), 3, 2)
    with pytest.raises(TypeError, match="`alpha` must be real-valued"):
        speculative.expected_tokens(np.array([0.5 + 0.1j]), 3)
    with pytest.raises(TypeError, match="`ls`"):
        otspec.lenience_curve(P, Q, ["0.5"])


def test_joint_from_tables_refuses_nan():
    """main: NaN multiplied through into the joint."""
    with pytest.raises(ValueError, match=r"`tables\[1\]` must hold finite non-negative probabilities"):
        models.joint_from_tables([np.array([0.5, 0.5]), np.array([[np.nan, 0.5], [0.25, 0.75]])])
    np.testing.assert_array_equal(models.joint_from_tables([[0.5, 0.5], [[1.0, 0.0], [0.25, 0.75]]]),
                                  [[0.5, 0.0], [0.125, 0.375]])


def test_float128_beyond_float64_is_refused_without_a_warning():
    x = P.astype(np.longdouble)
    x[0] = np.longdouble(2) ** 1100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="`p` must be finite, got entries beyond the float64 range"):
            otspec.alpha_k(x, Q, 2)


def test_token_ids_with_inf_are_refused_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="`drafts` must hold integer token ids"):
            otspec.kseq(P, Q, 2).sample(np.array([0.0, np.inf]), rng=0)


def test_otm_lp_tuples_prints_nothing_at_the_first_lp_of_a_process():
    """main: cvxpy's own HiGHS instance printed the banner ('Running HiGHS ...') to stdout."""
    code = "import numpy as np, otspec; otspec.otm_lp_tuples(np.array([.5, .5]), np.array([.2, .8]), 2)"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == ""
