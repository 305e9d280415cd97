r"""What a profile over contexts estimates: iteration starts of real decoding along a target-sampled text.

A lossless speculative-decoding run starts its iterations at contexts that
the run itself chooses, so its tokens per target call is a mean of
:math:`\tau + 1` over iteration starts (the Palm distribution of starts),
not over positions. Along a text :math:`y` sampled from the target, the
tower rule gives the exact probability that position ``t`` is an iteration
start, by a forward recursion over the emission probabilities

.. math::

    e(s, s + j) = P\big(\text{an iteration begun at } y_{<s}
    \text{ emits exactly } y_s \dots y_{s+j-1}\big), \qquad j = 1, \dots, L + 1,

.. math::

    r(0) = 1, \qquad r(t) = \sum_{s = t - L - 1}^{t - 1} r(s)\,
    \frac{e(s, t)}{Q(y_s \dots y_{t-1} \mid y_{<s})} = P(t \text{ is a start} \mid Y_{<t} = y_{<t}),

and tokens per call is :math:`T / E[\sum_{t<T} r(t)]`, estimated as a ratio
over many texts. The derivation, the bias of the per-position average and
when it matters are in the docs page ``docs/theory/profile.rst``.

``e`` needs only the draft's and the target's laws at the text's own
contexts: an emitted prefix that follows the text means every surviving
draft follows the text, and i.i.d. draft blocks that agree on a prefix
continue i.i.d. from the draft's law at that prefix. Token-level schemes
over ``k`` i.i.d. draft blocks (SpecTr's DraftSelection, Sun et al.,
arXiv:2310.15141, Algorithm 3) need, per depth, the joint law
:math:`W_m(y, c) = P(Y = y, \#\{i : X_i = y\} = c)` of the output token and
the number of the ``m`` surviving drafts equal to it; the block verifier
with one correction token needs its weight recursion along the text.

Notation: ``p`` is the draft law, ``q`` the target law, everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._array import to_host, validate_batch_pair
from .._registry import get_verifier, unknown_name_message, verifier_names
from .._validation import as_float_array, as_rng, first_bad_entry, validate_positive_int, validate_size
from ..multidraft._batched import batched_kseq_rho_star
from ..multidraft._priority_keys import PriorityKeyVerifier
from ..spectr._common import resolve_verifier
from ._quantities import text_probs

__all__ = [
    "RENEWAL_SCHEMES",
    "RenewalEstimate",
    "emission_probs",
    "emission_probs_along",
    "emission_probs_from_token_probs",
    "emission_tables",
    "palm_tokens_per_call",
    "per_position_tokens_per_call",
    "starts_recursion",
    "tokens_per_call",
]

#: How :func:`emission_probs` computes ``e`` for each scheme it accepts (``method="auto"``).
#: Other lossless i.i.d.-draft token verifiers of the registry (``"lp"``, ``"khisti"``, ...) are
#: accepted with ``method="enumerate"`` (exact, small vocabularies) or
#: ``method="mc"`` (Monte Carlo over many draft tuples per depth).
RENEWAL_SCHEMES = {
    "token": "closed form (Leviathan et al., arXiv:2211.17192, Algorithm 1), k = 1",
    "block-onestep": "closed form: the weight recursion along the text (Sun et al., arXiv:2403.10444), k = 1",
    "kseq": "closed form: first-accept generating function per depth (SpecTr, arXiv:2310.15141, Algorithm 2)",
    "multiround": "closed form: first-accept generating function per depth (recursive rejection, i.i.d. drafts)",
    "optimal": "closed form per position from its independent priority keys: O(V k) after the verifier's "
               "O(V log V) construction for each survivor count",
}

_METHODS = ("auto", "closed", "enumerate", "mc")


def _emission_length(L) -> int:
    """``L`` checked: an integer in ``[1, MAX_EMISSION_L]``, before any array of ``L + 1`` columns is made."""
    return validate_size(L, "L", cap=MAX_EMISSION_L, cap_name="MAX_EMISSION_L", hint="the laws hold L + 1 columns")
#: Largest number of (position, survivors) rows the enumeration or Monte Carlo fallbacks visit.
MAX_FALLBACK_ROWS = 200_000
#: Largest ``n_draws * k`` draft tokens drawn per row by ``method="mc"``.
MAX_MC_TOKENS = 10_000_000
#: Largest draft length ``L`` of the emission laws (one ``L + 1`` axis of floats per text position): 1,024, far past
#: any profile's ``L`` (:data:`otspec.profile.MAX_L`); ``L = 10**18`` was numpy's "array is too big".
MAX_EMISSION_L = 1024


# ----------------------------------------------------------------------------- input checks
def _scheme(scheme, k: int, method: str):
    """Validate the scheme name against the registry; return (name, route)."""
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(unknown_name_message("method", method, _METHODS))
    names = verifier_names(kind="token") + verifier_names(kind="block")
    if not isinstance(scheme, str):
        raise TypeError(f"`scheme` must be a registered verifier name (one of {names}), got {type(scheme).__name__}")
    if scheme not in names:
        raise ValueError(f"`scheme` must be a registered verifier name (one of {names}), got {scheme!r}")
    spec = get_verifier(scheme)
    if scheme == "block":
        raise ValueError(
            "`scheme`='block' (Sun et al., arXiv:2403.10444, Algorithm 3, with its multi-token residual) emits "
            "L + 1 tokens at every iteration, so its starts are the multiples of L + 1 whatever happens; average "
            "its expected target calls per iteration over those positions instead (docs/theory/profile.rst)"
        )
    if spec.kind == "block" and scheme != "block-onestep":
        raise ValueError(
            f"`scheme`={scheme!r} is a block scheme without emission probabilities here; block schemes accepted: "
            "'block-onestep'"
        )
    if not spec.lossless:
        raise ValueError(
            f"`scheme`={scheme!r} is lossy: its output does not follow the target, so a target-sampled text "
            "does not weight contexts as its run does; the recursion needs a lossless scheme"
        )
    if spec.kind == "token" and spec.draft_process != "iid":
        raise ValueError(
            f"`scheme`={scheme!r} drafts by the process {spec.draft_process!r}; the emission probabilities here "
            "assume k i.i.d. draft blocks"
        )
    if (spec.single_draft or scheme == "token") and k != 1:
        raise ValueError(f"`scheme`={scheme!r} verifies a single draft block, so `k` must be 1, got {k}")
    closed = scheme in RENEWAL_SCHEMES
    if method == "closed" and not closed:
        raise ValueError(
            f"`method`='closed' has no closed form for `scheme`={scheme!r} (closed forms: {tuple(RENEWAL_SCHEMES)}); "
            "pass method='enumerate' or 'mc'"
        )
    if scheme == "block-onestep" and method in ("enumerate", "mc"):
        raise ValueError("`scheme`='block-onestep' has only the closed form; pass method='auto' or 'closed'")
    route = ("closed" if closed else "enumerate") if method == "auto" else method
    return scheme, route


def _laws(p, q, name_p: str, name_q: str):
    try:
        P, Q, _ = validate_batch_pair(p, q)
    except (TypeError, ValueError) as exc:
        msg = str(exc).replace("`p`", f"`{name_p}`").replace("`q`", f"`{name_q}`")
        raise type(exc)(msg) from exc
    P = np.asarray(P, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    if P.ndim < 2:
        raise ValueError(f"`{name_p}` must have shape (..., positions, V), got {P.shape}")
    return P, Q


def _tokens(y, shape: tuple[int, ...], V: int, name: str) -> np.ndarray:
    if isinstance(y, (str, bytes)):
        raise TypeError(f"`{name}` must be an integer array, got {type(y).__name__}")
    Y = np.asarray(y)
    if Y.dtype == bool or not np.issubdtype(Y.dtype, np.integer):
        raise TypeError(f"`{name}` must be an integer array of token ids, got dtype {Y.dtype}")
    if Y.shape != shape:
        raise ValueError(f"`{name}` must have shape {shape} (the laws' shape without V), got {Y.shape}")
    if Y.size and (Y.min() < 0 or Y.max() >= V):
        raise ValueError(f"`{name}` must hold token ids in [0, {V}), got values in [{Y.min()}, {Y.max()}]")
    return Y.astype(np.int64)


# ----------------------------------------------------------------------------- per-position step laws
def _at(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """``X[..., t, Y[..., t]]``: the law of every row at the text's own token."""
    return np.take_along_axis(X, Y[..., None], axis=-1)[..., 0]


def _poly_mul_linear(poly: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> np.ndarray:
    """Coefficients of ``poly(z) * (b0 + b1 z)`` along the last axis (batched)."""
    out = np.zeros(poly.shape[:-1] + (poly.shape[-1] + 1,))
    out[..., :-1] = poly * b0[..., None]
    out[..., 1:] += poly * b1[..., None]
    return out


def _first_accept_law(py, accepts_y, rej_tot, residual_y, m: int) -> np.ndarray:
    r"""``W_m(y, c)``, ``c = 0..m``, of a first-accept rule at the text token ``y`` (batched rows).

    With :math:`A_i = p(y) a_i(y)`, :math:`r_i = p(y)(1 - a_i(y))`, :math:`E_i = \sum_x p(x)(1 - a_i(x))`
    and :math:`F(z) = 1 - p(y) + p(y) z`:
    :math:`\sum_c W(y, c) z^c = \sum_{j=1}^{m} \prod_{i<j}(E_i - r_i + r_i z)\, A_j z\, F(z)^{m-j}
    + \mathrm{res}(y) \prod_{i \le m}(E_i - r_i + r_i z)`.
    """
    R = py.shape
    fpow = [np.ones(R + (1,))]
    for _ in range(m - 1):
        fpow.append(_poly_mul_linear(fpow[-1], 1.0 - py, py))
    law = np.zeros(R + (m + 1,))
    prefix = np.ones(R + (1,))
    for j in range(m):
        a = accepts_y[j]
        term = _poly_mul_linear(prefix, np.zeros(R), py * a)  # prefix * A_j z
        term = _poly_mul(term, fpow[m - 1 - j])
        law[..., : term.shape[-1]] += term
        r = py * (1.0 - a)
        prefix = _poly_mul_linear(prefix, np.maximum(rej_tot[j] - r, 0.0), r)
    law[..., : prefix.shape[-1]] += residual_y[..., None] * prefix
    return law


def _poly_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros(a.shape[:-1] + (a.shape[-1] + b.shape[-1] - 1,))
    for i in range(b.shape[-1]):
        out[..., i : i + a.shape[-1]] += a * b[..., i : i + 1]
    return out


def _kseq_parts(P, Q, m: int):
    """Vectorised :func:`otspec.multidraft._kseq._kseq_parts` at ``rho = rho*(m)``: (accept, E, residual)."""
    rho = np.asarray(batched_kseq_rho_star(P, Q, m, validate=False), dtype=np.float64)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(Q >= rho * P, 1.0, Q / (rho * P))
    mins = np.minimum(P, Q / rho)
    beta = mins.sum(axis=-1)
    E = (P - mins).sum(axis=-1)
    with np.errstate(divide="ignore"):
        p_acc = np.where(beta < 0.5, -np.expm1(m * np.log1p(-np.minimum(beta, 1.0))), -np.expm1(m * np.log(E)))
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(beta > 0, p_acc / np.where(beta > 0, beta, 1.0), float(m))
    c = np.minimum(c, rho[..., 0])[..., None]
    v = np.maximum(np.where(Q >= rho * P, Q - P * c, Q * (1.0 - c / rho)), 0.0)
    tot = v.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.where(tot > 0, v / np.where(tot > 0, tot, 1.0), Q)
    rej = (P * (1.0 - accept)).sum(axis=-1)
    return accept, rej, res


def _residual_rows(P, T):
    """Rows of ``(T - P)_+`` normalised; ``T`` where a row has no mass (the guarded normaliser)."""
    w = np.maximum(T - P, 0.0)
    s = w.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s > 0, w / np.where(s > 0, s, 1.0), T)


#: Rows of (V,) laws processed at once by the closed forms (bounds the float64 temporaries to a few x 32 MB).
_CHUNK_ELEMENTS = 2**22


def _step_laws_closed(scheme: str, P, Q, Y, k: int) -> np.ndarray:
    """``W[..., m-1, c] = P(Y = y_t, c drafts equal y_t | m drafts)`` at every position, closed forms, in row chunks."""
    V = P.shape[-1]
    Pf, Qf, Yf = P.reshape(-1, V), Q.reshape(-1, V), Y.reshape(-1)
    step = max(1, _CHUNK_ELEMENTS // V)
    out = np.zeros((Yf.shape[0], k, k + 1))
    for i in range(0, Yf.shape[0], step):
        out[i : i + step] = _step_laws_rows(scheme, Pf[i : i + step], Qf[i : i + step], Yf[i : i + step], k)
    return out.reshape(Y.shape + (k, k + 1))


def _token_step_law(py, qy) -> np.ndarray:
    """Speculative sampling: ``W(y, 1) = min(p, q)(y)``, ``W(y, 0) = (q - p)_+(y)``."""
    W = np.zeros(py.shape + (1, 2))
    W[..., 0, 1] = np.minimum(py, qy)
    W[..., 0, 0] = np.maximum(qy - py, 0.0)
    return W


def _step_laws_rows(scheme: str, P, Q, Y, k: int) -> np.ndarray:
    shape = Y.shape
    W = np.zeros(shape + (k, k + 1))
    py, qy = _at(P, Y), _at(Q, Y)
    if scheme == "token":
        return _token_step_law(py, qy)
    if scheme == "kseq":
        for m in range(1, k + 1):
            accept, rej, res = _kseq_parts(P, Q, m)
            a_y = _at(accept, Y)
            W[..., m - 1, : m + 1] = _first_accept_law(py, [a_y] * m, [rej] * m, _at(res, Y), m)
        return W
    # multiround with replacement: round targets t_1 = q, t_{i+1} = residual(p, t_i)
    targets = [Q]
    for _ in range(k):
        targets.append(_residual_rows(P, targets[-1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        accepts = [np.where(P > 0, np.minimum(1.0, t / np.where(P > 0, P, 1.0)), 1.0) for t in targets[:k]]
    a_y = [_at(a, Y) for a in accepts]
    rej = [(P * (1.0 - a)).sum(axis=-1) for a in accepts]
    for m in range(1, k + 1):
        W[..., m - 1, : m + 1] = _first_accept_law(py, a_y[:m], rej[:m], _at(targets[m], Y), m)
    return W


def _priority_keys_law(v, y: int, m: int) -> np.ndarray:
    r"""``W_m(y, c)`` of the priority-key verifier (largest key wins, then one speculative step).

    The ``m`` keys are i.i.d. uniform on [0, 1] and a draft's token is the
    token whose key set holds its key. Given the largest key ``s`` (density
    :math:`m s^{m-1}`), the other keys are i.i.d. uniform on :math:`[0, s]`
    and each is a ``y`` with probability :math:`\ell_y(s)/s`, :math:`\ell_y(s)`
    the length of ``y``'s key set below ``s``. On an interval :math:`[l, h]` of
    token :math:`x \ne y`, :math:`\ell_y = \ell` is constant and
    :math:`P(Z \in [l, h], N_y = c) = m \binom{m-1}{c} \ell^c \frac{(h - \ell)^{m-c} - (l - \ell)^{m-c}}{m - c}`;
    on an interval of ``y``, :math:`s - \ell_y(s) = g` is constant and
    :math:`P(Z \in [l, h], N_y = c + 1) = m \binom{m-1}{c} g^{m-1-c} \frac{(h - g)^{c+1} - (l - g)^{c+1}}{c + 1}`.
    """
    token, top, length = (np.asarray(a) for a in v.pieces)
    a, res = np.asarray(v._a), np.asarray(v.residual)
    # only y's intervals and those of rejectable tokens (a < 1) contribute
    keep = (token == y) | (a[token] < 1.0)
    token, top, length = token[keep], top[keep], length[keep]
    lo = top - np.minimum(length, top)  # an interval reaching below 0 by rounding is cut at 0
    mine = token == y
    ylo, yhi = lo[mine], top[mine]
    below = np.clip(lo[:, None] - ylo[None, :], 0.0, (yhi - ylo)[None, :]).sum(axis=1)  # l_y at each lower end
    c = np.arange(m)  # c (other tokens) or c + 1 (y's intervals)
    binom = np.array([math.comb(m - 1, int(i)) for i in c], dtype=np.float64)
    ell = below
    other = m * binom * _powers(ell, m - 1) * (_powers(top - ell, m)[:, ::-1][:, :m]
                                               - _powers(lo - ell, m)[:, ::-1][:, :m]) / (m - c)
    g = np.maximum(lo - below, 0.0)
    own = m * binom * _powers(g, m - 1)[:, ::-1] * (_powers(top - g, m)[:, 1:] - _powers(lo - g, m)[:, 1:]) / (c + 1)
    joint = np.zeros((token.shape[0], m + 1))  # P(Z in interval, N_y = c), c = 0..m
    joint[~mine, :m] = other[~mine]
    joint[mine, 1:] = own[mine]
    return a[y] * joint[mine].sum(axis=0) + res[y] * ((1.0 - a[token])[:, None] * joint).sum(axis=0)


def _powers(x: np.ndarray, n: int) -> np.ndarray:
    """``out[..., j] = x ** j`` for ``j = 0..n`` by repeated products."""
    out = np.empty(x.shape + (n + 1,))
    out[..., 0] = 1.0
    for j in range(1, n + 1):
        out[..., j] = out[..., j - 1] * x
    return out


def _step_laws_optimal(P, Q, Y, k: int, max_rows: int) -> np.ndarray:
    """``W`` of the optimal verifier from its priority keys, per position and survivor count."""
    build = get_verifier("optimal").build
    V = P.shape[-1]
    Pf, Qf, Yf = P.reshape(-1, V), Q.reshape(-1, V), Y.reshape(-1)
    if Pf.shape[0] * k > max_rows:
        raise ValueError(
            f"the optimal verifier's closed form visits {Pf.shape[0] * k} (position, survivors) rows, above "
            f"MAX_FALLBACK_ROWS={max_rows}; pass fewer positions"
        )
    W = np.zeros((Pf.shape[0], k, k + 1))
    for r in range(Pf.shape[0]):
        for m in range(1, k + 1):
            v = build(Pf[r], Qf[r], m)
            if not isinstance(v, PriorityKeyVerifier):  # pragma: no cover - the registry builds priority keys
                raise TypeError(f"`scheme`='optimal' built a {type(v).__name__}, which has no closed form here; "
                                "pass method='enumerate' or 'mc'")
            W[r, m - 1, : m + 1] = _priority_keys_law(v, int(Yf[r]), m)
    return W.reshape(Y.shape + (k, k + 1))


def _step_laws_fallback(scheme: str, P, Q, Y, k: int, route: str, n_draws: int, gen, max_enum: int):
    """``W`` by the verifier's exact step law (enumeration) or a Monte Carlo average over many draft tuples."""
    factory = resolve_verifier(scheme)
    shape = Y.shape
    V = P.shape[-1]
    Pf, Qf, Yf = P.reshape(-1, V), Q.reshape(-1, V), Y.reshape(-1)
    rows = Pf.shape[0] * k
    if rows > MAX_FALLBACK_ROWS:
        raise ValueError(
            f"`method`={route!r} visits {rows} (position, survivors) rows, above MAX_FALLBACK_ROWS="
            f"{MAX_FALLBACK_ROWS}; pass fewer positions"
        )
    W = np.zeros((Pf.shape[0], k, k + 1))
    for r in range(Pf.shape[0]):
        p, q, y = Pf[r], Qf[r], int(Yf[r])
        for m in range(1, k + 1):
            if route == "enumerate":
                W[r, m - 1, : m + 1] = factory.step_law(p, q, m, max_enum=max_enum, fast=False)[y]
                continue
            v = factory(p, q, m)
            X = gen.choice(V, size=(n_draws, m), p=p)
            n_eq = (X == y).sum(axis=1)
            ky = np.array([v.conditional(tuple(x))[y] for x in X.tolist()])
            W[r, m - 1, : m + 1] = np.bincount(n_eq, weights=ky, minlength=m + 1) / n_draws
    return W.reshape(shape + (k, k + 1))


# ----------------------------------------------------------------------------- emission probabilities
def _shift(X: np.ndarray, d: int, axis_pos: int) -> np.ndarray:
    """``X`` at position ``s + d`` for every start ``s`` (zeros past the end), along axis ``axis_pos``."""
    if d == 0:
        return X
    out = np.zeros_like(X)
    n = X.shape[axis_pos]
    if d < n:
        src = [slice(None)] * X.ndim
        dst = [slice(None)] * X.ndim
        src[axis_pos] = slice(d, None)
        dst[axis_pos] = slice(0, n - d)
        out[tuple(dst)] = X[tuple(src)]
    return out


def _chain(W: np.ndarray, qy: np.ndarray, k: int, L: int) -> np.ndarray:
    """Emission probabilities of DraftSelection from the per-position step laws (all starts at once)."""
    pos = W.ndim - 3  # axis of positions in W (..., T, k, k+1)
    T = W.shape[pos]
    e = np.zeros(W.shape[:-2] + (L + 1,))
    pi = np.zeros(W.shape[:-2] + (k + 1,))
    pi[..., k] = 1.0  # k drafts survive at depth 0
    for d in range(L):
        Wd = _shift(W, d, pos)  # (..., T, k, k+1): the step law at position s + d
        e[..., d] = np.einsum("...m,...m->...", pi[..., 1:], Wd[..., :, 0])
        new = np.zeros_like(pi)
        new[..., 1:] = np.einsum("...m,...mc->...c", pi[..., 1:], Wd[..., :, 1:])
        pi = new
    e[..., L] = pi[..., 1:].sum(axis=-1) * _shift(qy, L, qy.ndim - 1)
    # a start whose j emitted tokens run past the text has no defined e: zero
    j = np.arange(1, L + 2)
    s = np.arange(T)[:, None]
    return np.where(s + j[None, :] <= T, e, 0.0)


def _onestep(py: np.ndarray, qy: np.ndarray, L: int) -> np.ndarray:
    r"""Block verification with one correction token along the text, every start at once.

    With :math:`S_i = \prod_{l<i} p_l(y_l)` (the draft's joint probability of the
    text's first ``i`` tokens) and :math:`a_i = S_i w_i` (:math:`w_i` the block
    weights :math:`w_0 = 1`, :math:`w_i = \min(w_{i-1} q_{i-1}(y_{i-1}) / p_{i-1}(y_{i-1}), 1)`),
    so :math:`a_0 = 1`, :math:`a_{i+1} = \min(a_i q_i(y_i), S_{i+1})`:
    :math:`e_{j} = (a_{j-1} q_{j-1}(y_{j-1}) - S_{j-1} p_{j-1}(y_{j-1}))_+` for
    :math:`j \le L` and :math:`e_{L+1} = a_L q_L(y_L)`.
    """
    T = py.shape[-1]
    ax = py.ndim - 1
    e = np.zeros(py.shape + (L + 1,))
    S = np.ones(py.shape)
    a = np.ones(py.shape)
    for i in range(L):
        pi, qi = _shift(py, i, ax), _shift(qy, i, ax)
        e[..., i] = np.maximum(a * qi - S * pi, 0.0)
        S = S * pi
        a = np.minimum(a * qi, S)
    e[..., L] = a * _shift(qy, L, ax)
    j = np.arange(1, L + 2)
    s = np.arange(T)[:, None]
    return np.where(s + j[None, :] <= T, e, 0.0)


def _emission(scheme, P, Q, Y, k, L, method, n_draws, rng, max_enum):
    name, route = _scheme(scheme, k, method)
    if name == "block-onestep":
        return _onestep(_at(P, Y), _at(Q, Y), L)
    if route == "closed" and name == "optimal":
        W = _step_laws_optimal(P, Q, Y, k, MAX_FALLBACK_ROWS)
    elif route == "closed":
        W = _step_laws_closed(name, P, Q, Y, k)
    else:
        n_draws = validate_positive_int(n_draws, "n_draws")
        if route == "mc" and n_draws * k > MAX_MC_TOKENS:
            raise ValueError(f"`n_draws`={n_draws} times `k`={k} exceeds MAX_MC_TOKENS={MAX_MC_TOKENS}")
        W = _step_laws_fallback(name, P, Q, Y, k, route, n_draws, as_rng(rng), max_enum)
    return _chain(W, _at(Q, Y), k, L)


def emission_tables(scheme: str, P: np.ndarray, Q: np.ndarray, Y: np.ndarray, ks, Ls, *, py=None) -> dict:
    r""":func:`emission_probs_along` for every ``k`` in ``ks`` and ``L`` in ``Ls``, the step laws computed once.

    .. math::

        e_{k,L}[\dots, s, j - 1] = P\big(\text{the iteration begun at } y_{<s}
        \text{ emits exactly } y_s \dots y_{s+j-1}\big)

    For trusted laws (``(..., T, V)`` float64 rows on the simplex, as the
    profile's models give them; not checked here) and a scheme with a closed
    form (:data:`RENEWAL_SCHEMES`): token verification and the one-step
    block verifier read only the text tokens' probabilities; k-Seq,
    multi-round and the optimal verifier compute their step laws :math:`W_m`,
    ``m = 1..max(ks)``, once (each ``W_m`` depends on ``m`` alone, not on the
    number of drafts it is part of) and chain them for every ``(k, L)``. The
    values equal :func:`emission_probs_along`'s bit for bit. The laws may be
    torch tensors (on an accelerator): the token-only schemes gather the text
    tokens' probabilities where the laws are (only ``(..., T)`` values reach
    the host; ``py``, the text tokens' draft probabilities when the caller read them already with other values:
    no read here), the others read a host copy.

    Returns
    -------
    dict
        ``{(k, L): (..., T, L + 1) ndarray of float64}``.

    Raises
    ------
    ValueError
        A scheme without a closed form, or ``k`` and ``L`` as :func:`emission_probs`.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.profile._renewal import emission_probs_along, emission_tables
    >>> p, q, y = np.array([[0.5, 0.5]] * 3), np.array([[0.25, 0.75]] * 3), np.array([1, 0, 1])
    >>> e = emission_tables("token", p, q, y, ks=[1], Ls=[1, 2])
    >>> bool((e[(1, 2)] == emission_probs_along("token", p, q, y, L=2)).all())
    True
    """
    ks = [validate_positive_int(k, "k") for k in ks]
    Ls = [_emission_length(L) for L in Ls]
    for k in ks:  # the scheme, its closed form and every k checked (ValueError otherwise)
        _scheme(scheme, k, "closed")
    if not (isinstance(P, np.ndarray) and isinstance(Q, np.ndarray)) and scheme not in ("token", "block-onestep"):
        P, Q = to_host(P), to_host(Q)  # the other schemes' step laws read every token: on the host
    # where the laws are: only (..., T) values reach the host
    py, qy = (text_probs(P, Y) if py is None else np.asarray(py)), text_probs(Q, Y)
    if scheme == "block-onestep":
        return {(k, L): _onestep(py, qy, L) for k in ks for L in Ls}
    k_max = max(ks)
    if scheme == "token":
        W = _token_step_law(py, qy)
    elif scheme == "optimal":
        W = _step_laws_optimal(P, Q, Y, k_max, MAX_FALLBACK_ROWS)
    else:
        W = _step_laws_closed(scheme, P, Q, Y, k_max)
    out = {}
    for k in ks:
        Wk = W if k == k_max else np.ascontiguousarray(W[..., :k, : k + 1])
        for L in Ls:
            out[(k, L)] = _chain(Wk, qy, k, L)
    return out


def emission_probs(scheme, p_path, q_path, y_path, *, k=1, L=None, method="auto", n_draws=4096, rng=None,
                   max_enum=100_000):
    r"""Probability that one iteration begun at a context emits exactly the text's next ``j`` tokens.

    .. math::

        e_j = P\big(\text{the iteration begun at } y_{<s} \text{ emits exactly }
        y_s \dots y_{s+j-1}\big), \qquad j = 1, \dots, L + 1,

    i.e. ``j - 1`` accepted draft tokens followed by the correction
    (``j <= L``) or by the bonus token (``j = L + 1``), averaged exactly over
    the drafts and the verifier's randomness. For token verification
    (Leviathan et al., arXiv:2211.17192, Algorithm 1)

    .. math::

        e_j = \prod_{i < j - 1} \min(p_i, q_i)(y_{s+i}) \cdot (q_{j-1} - p_{j-1})_+(y_{s+j-1}),
        \qquad e_{L+1} = \prod_{i < L} \min(p_i, q_i)(y_{s+i}) \cdot q_L(y_{s+L}),

    with :math:`p_i, q_i` the draft and target laws after :math:`y_{<s+i}`.
    Token-level schemes over ``k`` i.i.d. draft blocks (SpecTr's
    DraftSelection) carry the law of the number of surviving drafts along the
    text: with ``m`` survivors at depth ``i``, all following the text, their
    next tokens are ``m`` i.i.d. draws from :math:`p_i`, and
    :math:`W_m(y, c) = P(Y = y, c \text{ drafts equal } y)` moves ``m`` to
    ``c`` (``c = 0`` ends the iteration on a correction).

    Routes (``method``):

    * ``"closed"`` (``"auto"`` picks it where it exists, see
      :data:`RENEWAL_SCHEMES`): ``"token"``; ``"block-onestep"`` (Sun et al.,
      arXiv:2403.10444, one correction token: with :math:`P(\tau \ge i \mid
      X^i) = w_i`, the block weight, :math:`e_j = (a_{j-1} q_{j-1}(y) -
      S_{j-1} p_{j-1}(y))_+`, :math:`a_i = S_i w_i`, :math:`S_i` the draft's
      joint probability of the text's first ``i`` tokens); ``"kseq"`` and
      ``"multiround"`` (first-accept rules: :math:`W_m` by a generating
      function in :math:`O(k^2)` per depth after the :math:`O(V)` acceptance
      probabilities and residual, with :math:`\rho^*(m)` for k-Seq);
      ``"optimal"`` (its independent priority keys: given the largest key the
      others are i.i.d. uniform below it, so :math:`W_m` is a sum of
      polynomial integrals over the key intervals, :math:`O(V k)` per position
      and ``m`` after building the verifier). Exact to rounding (1e-12 against
      enumeration in the tests).
    * ``"enumerate"`` (``"auto"`` for every other lossless i.i.d.-draft
      token verifier of the registry: ``"lp"``, ``"khisti"``):
      :math:`W_m` by the verifier's exact conditional law summed over the
      enumerated draft multisets (or ordered tuples), per position and per
      ``m``; exact, for small vocabularies (at most ``max_enum`` multisets).
    * ``"mc"``: :math:`W_m` as an average of :math:`K(y \mid X) 1\{c(X) = c\}`
      over ``n_draws`` draft tuples per position and per ``m`` (the
      verifier's exact conditional law, so only the drafts are sampled);
      unbiased for ``e`` (depths use independent draws), with Monte Carlo
      error :math:`O(n_{\rm draws}^{-1/2})` per entry. Use many draws: one
      draw per start makes the recursion's weights :math:`e/Q` explode.

    Parameters
    ----------
    scheme : str
        A registered verifier name (:data:`otspec.multidraft.VERIFIERS`):
        ``"token"``, ``"block-onestep"``, ``"kseq"``, ``"multiround"``,
        ``"optimal"``, ``"lp"``, ``"khisti"``, ... (lossless, i.i.d. drafts).
    p_path, q_path : (..., L + 1, V) arrays of float
        Draft and target laws after :math:`y_{<s}, y_{<s+1}, \dots, y_{<s+L}`
        (rows on the simplex within 1e-9).
    y_path : (..., L + 1) array of int
        The text's tokens :math:`y_s, \dots, y_{s+L}`.
    k : int, keyword-only
        Number of i.i.d. draft blocks (1 for ``"token"`` and ``"block-onestep"``).
    L : int or None, keyword-only
        Draft length; None: ``p_path.shape[-2] - 1``. Must not exceed it.
    method : {"auto", "closed", "enumerate", "mc"}, keyword-only
    n_draws : int, keyword-only
        Draft tuples per position and per survivor count (``method="mc"``).
    rng : numpy.random.Generator, int or None, keyword-only
        Randomness of ``method="mc"``.
    max_enum : int, keyword-only
        Largest number of draft multisets (tuples) enumerated per step (``method="enumerate"``).

    Returns
    -------
    (..., L + 1) ndarray of float64
        ``e[..., j - 1]``; :math:`0 \le e_j \le Q(y_s \dots y_{s+j-1} \mid y_{<s})`.

    Raises
    ------
    ValueError
        Unknown, lossy or non-i.i.d. scheme, ``"block"`` (its iterations
        always emit ``L + 1`` tokens), ``k != 1`` for a single-draft scheme,
        shapes that disagree, laws off the simplex, token ids out of range,
        ``L`` above the path, no closed form for ``method="closed"``.
    TypeError
        ``scheme`` not a string, ``y_path`` not integer.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding",
       arXiv:2211.17192, Algorithm 1.
    .. [2] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal Transport",
       arXiv:2310.15141, Algorithms 2 and 3.
    .. [3] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 (one-correction-token variant).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.profile import emission_probs
    >>> p = np.array([[0.5, 0.5]] * 3)     # draft laws along the text
    >>> q = np.array([[0.25, 0.75]] * 3)   # target laws along the text
    >>> emission_probs("token", p, q, np.array([1, 0, 1]), L=2).tolist()
    [0.25, 0.0, 0.09375]
    """
    k = validate_positive_int(k, "k")
    P, Q = _laws(p_path, q_path, "p_path", "q_path")
    Y = _tokens(y_path, P.shape[:-1], P.shape[-1], "y_path")
    n = P.shape[-2]
    if L is None:
        L = n - 1
    L = _emission_length(L)
    if L + 1 > n:
        raise ValueError(f"`L`={L} needs L + 1 = {L + 1} laws along the path, but `p_path` has {n}")
    P, Q, Y = P[..., : L + 1, :], Q[..., : L + 1, :], Y[..., : L + 1]
    return _emission(scheme, P, Q, Y, k, L, method, n_draws, rng, max_enum)[..., 0, :]


def emission_probs_along(scheme, p_text, q_text, y_text, *, L, k=1, method="auto", n_draws=4096, rng=None,
                         max_enum=100_000):
    r""":func:`emission_probs` at every start ``s`` of whole texts at once (the step laws computed once per position).

    .. math::

        e[\dots, s, j - 1] = P\big(\text{the iteration begun at } y_{<s}
        \text{ emits exactly } y_s \dots y_{s+j-1}\big), \qquad s + j \le T,

    and 0 where ``s + j > T`` (the text ends first).

    Parameters
    ----------
    scheme : str
        As in :func:`emission_probs`.
    p_text, q_text : (..., T, V) arrays of float
        Draft and target laws after :math:`y_{<t}`, ``t = 0..T-1``.
    y_text : (..., T) array of int
        The text.
    L : int, keyword-only
        Draft length.
    k, method, n_draws, rng, max_enum
        As in :func:`emission_probs`.

    Returns
    -------
    (..., T, L + 1) ndarray of float64

    Raises
    ------
    ValueError, TypeError
        As :func:`emission_probs`.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.profile import emission_probs_along
    >>> p, q = np.array([[0.5, 0.5]] * 3), np.array([[0.25, 0.75]] * 3)
    >>> emission_probs_along("token", p, q, np.array([1, 0, 1]), L=1).round(4).tolist()
    [[0.25, 0.125], [0.0, 0.1875], [0.25, 0.0]]
    """
    k = validate_positive_int(k, "k")
    L = _emission_length(L)
    P, Q = _laws(p_text, q_text, "p_text", "q_text")
    Y = _tokens(y_text, P.shape[:-1], P.shape[-1], "y_text")
    return _emission(scheme, P, Q, Y, k, L, method, n_draws, rng, max_enum)


def emission_probs_from_token_probs(scheme, p_y, q_y, *, L) -> np.ndarray:
    r"""Emission probabilities of the single-draft schemes from the text tokens' probabilities alone.

    .. math::

        \text{token:}\quad e(s, s + j) = \prod_{i < j - 1} \min(p_{s+i}, q_{s+i}) \cdot (q_{s+j-1} - p_{s+j-1})_+,
        \qquad e(s, s + L + 1) = \prod_{i < L} \min(p_{s+i}, q_{s+i}) \cdot q_{s+L},

    with :math:`p_t = p(y_t \mid y_{<t})` and :math:`q_t = q(y_t \mid y_{<t})`
    (and the weight recursion of :func:`emission_probs` for
    ``"block-onestep"``): token verification and block verification with one
    correction token need no other entry of the laws, so a profile of these
    schemes needs only the log-probabilities of the text under both models.
    Equal to :func:`emission_probs_along` (same arithmetic).

    Parameters
    ----------
    scheme : {"token", "block-onestep"}
    p_y, q_y : (..., T) arrays of float
        Draft and target probabilities of the text's tokens, in [0, 1].
    L : int, keyword-only
        Draft length.

    Returns
    -------
    (..., T, L + 1) ndarray of float64
        ``e[..., s, j - 1]``, 0 where ``s + j > T``.

    Raises
    ------
    ValueError
        Another scheme, shapes that differ, probabilities outside [0, 1] or not finite.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, arXiv:2211.17192, Algorithm 1.
    .. [2] Sun, Ro, Beirami, Suresh, arXiv:2403.10444 (one-correction-token variant).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.profile import emission_probs_from_token_probs
    >>> emission_probs_from_token_probs("token", np.array([0.5, 0.5, 0.5]), np.array([0.75, 0.25, 0.75]), L=2)[0]
    array([0.25   , 0.     , 0.09375])
    """
    if not isinstance(scheme, str) or scheme not in ("token", "block-onestep"):  # an array: never compared
        raise (ValueError if isinstance(scheme, str) else TypeError)(
            f"`scheme` must be 'token' or 'block-onestep' (the schemes that need only the text tokens' "
            f"probabilities), got {scheme!r}")
    L = _emission_length(L)
    py = as_float_array(p_y, "p_y")
    qy = as_float_array(q_y, "q_y")
    if py.shape != qy.shape or py.ndim < 1:
        raise ValueError(f"`p_y` and `q_y` must have one shape (..., T), got {py.shape} and {qy.shape}")
    for name, x in (("p_y", py), ("q_y", qy)):
        if not np.all(np.isfinite(x)) or np.any(x < 0) or np.any(x > 1):
            raise ValueError(f"`{name}` must hold probabilities in [0, 1], got "
                             f"{first_bad_entry(x, ~((x >= 0) & (x <= 1)))}")
    if scheme == "block-onestep":
        return _onestep(py, qy, L)
    return _chain(_token_step_law(py, qy), qy, 1, L)


# ----------------------------------------------------------------------------- the recursion and the estimators
def _lengths(lengths, batch: tuple[int, ...], T: int) -> np.ndarray:
    if lengths is None:
        return np.full(batch, T, dtype=np.int64)
    n = np.asarray(lengths)
    if n.dtype == bool or not np.issubdtype(n.dtype, np.integer):
        raise TypeError(f"`lengths` must be an integer array, got dtype {n.dtype}")
    if n.shape != batch:
        raise ValueError(f"`lengths` must have shape {batch} (one length per text), got {n.shape}")
    if n.size and (n.min() < 1 or n.max() > T):
        raise ValueError(f"`lengths` must lie in [1, {T}], got values in [{n.min()}, {n.max()}]")
    return n.astype(np.int64)


#: ln(2**-1022), the log of the smallest normal double: :func:`starts_recursion` refuses a path of target
#: probability below it (its emission e <= Q is then subnormal or 0, and e / Q undetermined)
_LOG_TINY = -1022 * math.log(2.0)


def starts_recursion(e, log_q, *, lengths=None) -> np.ndarray:
    r"""Probability that each position of a target-sampled text is an iteration start of real decoding.

    .. math::

        r(0) = 1, \qquad
        r(t) = \sum_{j=1}^{\min(L+1, t)} r(t - j)\, \frac{e(t-j, t)}{Q(y_{t-j} \dots y_{t-1} \mid y_{<t-j})}
        = P\big(t \text{ is a start} \mid Y_{<t} = y_{<t}\big),

    exact for a lossless scheme whose run's output follows the target (the
    proof is in ``docs/theory/profile.rst``); :math:`E_{y \sim Q}[\sum_{t<T}
    r(t)]` is the expected number of target calls to decode ``T`` tokens.

    Parameters
    ----------
    e : (..., T, L + 1) array of float
        Emission probabilities at every start (:func:`emission_probs_along`).
    log_q : (..., T) array of float
        :math:`\log q(y_t \mid y_{<t})`, finite (the text is the target's).
    lengths : (...) array of int or None, keyword-only
        Length of each text when texts are padded to ``T``; positions at or
        past it get ``r = 0``.

    Returns
    -------
    (..., T) ndarray of float64
        ``r``, each in [0, 1] up to rounding.

    Raises
    ------
    ValueError
        Shapes that disagree, negative or non-finite ``e``, non-finite ``log_q``, bad ``lengths``; a path of at
        most ``L + 1`` text tokens whose target probability is below ``2**-1022`` (its emission, at most that
        probability, has lost its bits in float64: the ratio :math:`e / Q` is undetermined).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.profile import emission_probs_along, starts_recursion
    >>> p, q, y = np.array([[0.5, 0.5]] * 4), np.array([[0.25, 0.75]] * 4), np.array([1, 0, 1, 1])
    >>> e = emission_probs_along("token", p, q, y, L=1)
    >>> starts_recursion(e, np.log(q[np.arange(4), y])).round(4).tolist()
    [1.0, 0.3333, 0.6667, 0.5556]
    """
    E = as_float_array(e, "e")
    lq = as_float_array(log_q, "log_q")
    if E.ndim < 2:
        raise ValueError(f"`e` must have shape (..., T, L + 1), got {E.shape}")
    if lq.shape != E.shape[:-1]:
        raise ValueError(f"`log_q` must have shape {E.shape[:-1]} (the shape of `e` without L + 1), got {lq.shape}")
    if not np.all(np.isfinite(E)) or np.any(E < 0):
        raise ValueError(f"`e` must be finite and non-negative, got {first_bad_entry(E, ~(np.isfinite(E) & (E >= 0)))}")
    if not np.all(np.isfinite(lq)):
        raise ValueError("`log_q` must be finite: the text must have positive probability under the target, got "
                         f"{first_bad_entry(lq, ~np.isfinite(lq))}")
    T, L1 = E.shape[-2], E.shape[-1]
    n = _lengths(lengths, E.shape[:-2], T)
    C = np.concatenate([np.zeros(lq.shape[:-1] + (1,)), np.cumsum(lq, axis=-1)], axis=-1)
    for j in range(1, min(L1, T) + 1):
        # a path of target probability Q below the smallest normal double: e <= Q has lost its bits (or underflowed
        # to 0) and e / Q is not determined (it came out NaN: 0 * exp(x) = 0 * inf)
        low = C[..., j:] - C[..., :T + 1 - j] < _LOG_TINY  # log Q of the j tokens from each position
        low &= np.arange(j, T + 1) <= n[..., None]  # windows inside the text (its padding never counts)
        if np.any(low):
            at = np.unravel_index(int(np.argmax(low)), low.shape)
            where = f" of text {at[:-1]}" if at[:-1] else ""
            raise ValueError(
                f"`log_q` sums to {float(C[at[:-1] + (at[-1] + j,)] - C[at]):.6g} over the {j} token(s) from position "
                f"{at[-1]}{where}: a path of target probability below 2**-1022, where `e` (at most that probability) "
                "has no bits left to divide by it; float64 cannot compute this text's starts"
            )
    r = np.zeros(lq.shape)
    r[..., 0] = 1.0
    for t in range(1, T):
        acc = np.zeros(lq.shape[:-1])
        for j in range(1, min(L1, t) + 1):
            s = t - j
            acc += r[..., s] * E[..., s, j - 1] * np.exp(C[..., s] - C[..., t])
        r[..., t] = acc
    return np.where(np.arange(T) < n[..., None], r, 0.0)


@dataclass(frozen=True, eq=False)
class RenewalEstimate:
    r"""Tokens kept per target call of real decoding of the texts' lengths, estimated as a ratio over texts.

    .. math::

        \widehat{\rm TPC} = \frac{\sum_n T_n}{\sum_n \sum_{t < T_n} r_n(t)}
        \;\to\; \mathrm{TPC}_T = \frac{T}{E[N_T]},

    the tokens kept per call of decodes of ``T`` tokens: what
    :func:`otspec.decoding.speculative_decode` makes per call
    (``DecodeResult.block_efficiency``), since its last iterations draft only
    the tokens left and make none past ``T``. A decoder that drafts whole
    chains or trees to the end emits :math:`E[T + O_T] / E[N_T]` per call,
    larger by :math:`E[O_T] / E[N_T]` (its last iteration's overshoot
    :math:`O_T`, a few tenths of a token for decodes of 8 tokens): that is
    estimated by :func:`palm_tokens_per_call`; the two share the long-run
    limit (``docs/theory/profile.rst``).

    Attributes
    ----------
    starts : (n_texts,) ndarray of float64
        :math:`\sum_{t<T_n} r_n(t)`, each an unbiased estimate of the expected
        number of target calls to decode the text's ``T_n`` tokens (resample
        these with ``tokens`` for a bootstrap over texts).
    tokens : (n_texts,) ndarray of int64
        :math:`T_n`.
    tokens_per_call : float
        The ratio of sums: consistent, biased by :math:`O(1/n)`.
    std_error : float
        Delta-method standard error of the ratio (nan for one text).
    bias : float
        First-order (delta-method) estimate of the ratio's bias,
        :math:`(R s_S^2 - s_{TS}) / (n \bar S^2)`; subtract it for a
        second-order-unbiased estimate (nan for one text).
    """

    starts: np.ndarray
    tokens: np.ndarray
    tokens_per_call: float
    std_error: float
    bias: float

    @property
    def n_texts(self) -> int:
        """Number of texts."""
        return int(self.starts.shape[0])


def tokens_per_call(e, log_q, *, lengths=None) -> RenewalEstimate:
    r"""Tokens per target call of real decoding from target-sampled texts, by the ratio estimator.

    .. math::

        \widehat{\rm TPC} = \frac{\sum_n T_n}{\sum_n \sum_{t<T_n} r_n(t)}
        \xrightarrow[n \to \infty]{} \frac{E[T]}{E[N_T]},

    with ``r`` from :func:`starts_recursion` and :math:`N_T` the number of
    target calls real decoding makes for ``T`` tokens; for equal lengths this
    is ``T`` over the expected calls, exactly in the limit of many texts:
    the tokens *kept* per call of decodes with ``max_new_tokens = T``, which
    otspec's decoder makes (its last iterations draft only the tokens left).
    The tokens *emitted* per call of a decoder that drafts whole chains or
    trees to the end count the last iteration's overshoot too and are
    estimated by :func:`palm_tokens_per_call`
    (:class:`RenewalEstimate`).

    Parameters
    ----------
    e : (n_texts, T, L + 1) array of float
        Emission probabilities along each text (:func:`emission_probs_along`).
    log_q : (n_texts, T) array of float
        :math:`\log q(y_t \mid y_{<t})` along each text.
    lengths : (n_texts,) array of int or None, keyword-only
        Text lengths when padded to ``T``.

    Returns
    -------
    RenewalEstimate

    Raises
    ------
    ValueError
        As :func:`starts_recursion`, or ``e`` not of shape (n_texts, T, L + 1).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.profile import emission_probs_along, tokens_per_call
    >>> p, q, y = np.array([[[0.5, 0.5]] * 4]), np.array([[[0.25, 0.75]] * 4]), np.array([[1, 0, 1, 1]])
    >>> est = tokens_per_call(emission_probs_along("token", p, q, y, L=1), np.log(q[0, np.arange(4), y]))
    >>> round(est.tokens_per_call, 4), est.starts.round(4).tolist()
    (1.5, [2.5556])
    """
    E = as_float_array(e, "e")
    if E.ndim != 3:
        raise ValueError(f"`e` must have shape (n_texts, T, L + 1), got {E.shape}")
    r = starts_recursion(E, log_q, lengths=lengths)
    n = _lengths(lengths, E.shape[:1], E.shape[1])
    S = r.sum(axis=-1)
    Tn = n.astype(np.float64)
    ratio = float(Tn.sum() / S.sum())
    N = S.shape[0]
    if N > 1:
        sS, sT = S.var(ddof=1), Tn.var(ddof=1)
        sTS = float(np.cov(Tn, S, ddof=1)[0, 1])
        mS = S.mean()
        se = math.sqrt(max(sT - 2 * ratio * sTS + ratio**2 * sS, 0.0) / N) / mS
        bias = (ratio * sS - sTS) / (N * mS**2)
    else:
        se = bias = float("nan")
    S.setflags(write=False)
    n.setflags(write=False)
    return RenewalEstimate(starts=S, tokens=n, tokens_per_call=ratio, std_error=float(se), bias=float(bias))


def per_position_tokens_per_call(m, *, lengths=None) -> float:
    r"""The naive estimate: the average over every position of :math:`m(c) = E[\tau(c) + 1]`.

    .. math::

        \overline m = \frac{1}{\sum_n T_n} \sum_n \sum_{t < T_n} m(y^{(n)}_{<t})

    It weights contexts by position, while a run visits a stretch of text once
    per iteration: biased for tokens per call whenever ``m`` is correlated
    with the chance that a position is a start (``docs/theory/profile.rst``).

    Parameters
    ----------
    m : (n_texts, T) array of float
        The profile's :math:`E[\tau + 1]` at each position.
    lengths : (n_texts,) array of int or None, keyword-only

    Returns
    -------
    float

    Raises
    ------
    ValueError
        ``m`` not 2-D or not finite, bad ``lengths``.

    Examples
    --------
    >>> from otspec.profile import per_position_tokens_per_call
    >>> per_position_tokens_per_call([[1.0, 2.0, 3.0]])
    2.0
    """
    M = as_float_array(m, "m")
    if M.ndim != 2 or not np.all(np.isfinite(M)):
        raise ValueError(f"`m` must be a finite (n_texts, T) array, got shape {M.shape}")
    n = _lengths(lengths, M.shape[:1], M.shape[1])
    mask = np.arange(M.shape[1])[None, :] < n[:, None]
    return float(M[mask].sum() / mask.sum())


def palm_tokens_per_call(m, r, *, lengths=None) -> float:
    r"""The per-position profile re-weighted by the start probabilities (the Palm average).

    .. math::

        \frac{\sum_n \sum_{t<T_n} r_n(t)\, m(y^{(n)}_{<t})}{\sum_n \sum_{t<T_n} r_n(t)}

    Consistent for the tokens *emitted* per call of decodes of ``T`` tokens
    by a decoder that drafts whole chains or trees to the end,
    :math:`E[T + O_T] / E[N_T]` (the last iteration's overshoot :math:`O_T`
    included: its numerator estimates
    the expected tokens emitted by iterations begun before ``T``), where
    :func:`tokens_per_call` estimates the tokens kept, :math:`T / E[N_T]`;
    the two share the long-run limit.

    Parameters
    ----------
    m : (n_texts, T) array of float
        :math:`E[\tau + 1]` at each position.
    r : (n_texts, T) array of float
        Start probabilities (:func:`starts_recursion`).
    lengths : (n_texts,) array of int or None, keyword-only

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Shapes that disagree, non-finite input.

    Examples
    --------
    >>> from otspec.profile import palm_tokens_per_call
    >>> palm_tokens_per_call([[1.0, 3.0]], [[1.0, 0.0]])
    1.0
    """
    M = as_float_array(m, "m")
    R = as_float_array(r, "r")
    if M.ndim != 2 or R.shape != M.shape or not (np.all(np.isfinite(M)) and np.all(np.isfinite(R))):
        raise ValueError(f"`m` and `r` must be finite (n_texts, T) arrays of one shape, got {M.shape} and {R.shape}")
    n = _lengths(lengths, M.shape[:1], M.shape[1])
    w = np.where(np.arange(M.shape[1])[None, :] < n[:, None], R, 0.0)
    return float((w * M).sum() / w.sum())
