r"""The layout kernel of the priority-key verifier (one block, tokens by ``z/p`` descending).

Plain Python on scalars, so that it runs unchanged under numba's ``njit``
(used when numba is installed: the ``fast`` extra) and as CPython otherwise;
both give the same layout up to the last bits of ``log1p``/``expm1``.

The block is the interval of suffix masses :math:`[b, c]` (``c = b + p(D)``)
with the measure :math:`\mu([s_1, s_2]) = s_2^k - s_1^k` (the law of the
largest of ``k`` uniform keys). Tokens arrive by ``z/p`` descending; each
takes one interval of the *free* region's own coordinate, which always
reaches the free fragment at the right end (docs/theory/optimal_verifier.rst,
"Priority keys"). The free fragments to its left form a stack; a token that
does not fit in the right fragment pops fragments until the group of tokens
placed since a fragment was created, plus itself, fits as one interval that
starts inside that fragment.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import compile_in


def _pw(x, k, off):
    """``(off + x)**k``: the plain power at ``off = 0``; ``exp(k log1p(x))`` at ``off = 1`` (exact for ``x`` near 0)."""
    if off == 0:
        return x**k
    if x <= -1.0:
        return 0.0
    return math.exp(k * math.log1p(x))


def _inc(w, x, k, off):
    """``s**k - (s - w)**k`` at ``s = off + x``, ``0 <= w <= s``, with full relative accuracy."""
    s = x + off
    if s <= 0.0:
        return 0.0
    r = w / s
    if r >= 1.0:
        return _pw(x, k, off)
    return -math.expm1(k * math.log1p(-r)) * _pw(x, k, off)


def _dinc(w, x, k, off):
    """Derivative of :func:`_inc` in ``x``: ``k (s**(k-1) - (s - w)**(k-1))``."""
    r = w / (x + off)
    if r >= 1.0:
        return k * _pw(x, k - 1, off)
    return -math.expm1((k - 1) * math.log1p(-r)) * k * _pw(x, k - 1, off)


def _solve(w, dl, k, hi, off):
    """The ``x <= hi`` with ``_inc(w, x) = dl`` (convex increasing in ``x``: Newton from the right)."""
    if k == 1:  # the measure is the length itself: every position fits
        return hi
    lo = w - off  # the interval [x - w, x] may not reach below s = 0
    if off == 0:
        if k == 2:
            s = 0.5 * (dl / w + w)
            return hi if s > hi else s
        x = w + (dl / (k * w)) ** (1.0 / (k - 1))  # _inc(w, s) >= k w (s - w)**(k-1) = dl there
    else:
        # depth coordinate: s**k (1 - (1 - w/s)**k) >= s**k A on s <= off + hi, A its second factor at the
        # top, so the root lies below s = (dl / A)**(1/k), written as x = expm1(log(dl / A) / k) (exact near 0)
        x = lo  # no room (s <= 0 at hi) or nothing to realise (dl = 0, an underflowed z): the lowest end
        if hi + off > 0.0 and dl > 0.0:
            rh = w / (hi + off)
            a = 1.0 if rh >= 1.0 else -math.expm1(k * math.log1p(-rh))
            if a > 0.0:
                x = math.expm1(math.log(dl / a) / k)
        if x < lo:
            x = lo
    if x > hi:
        x = hi
    for _ in range(200):
        h = _inc(w, x, k, off) - dl
        if h <= 0.0:
            break
        d = _dinc(w, x, k, off)
        if not d > 0.0:
            break
        x_new = x - h / d
        if x_new < lo:
            x_new = lo
        if x - x_new <= 2.2e-16 * abs(x):
            x = x_new
            break
        x = x_new
    if off != 0 and x > hi:
        # a group whose mass exceeds its room by rounding (w > off + hi) is clamped at s = w above; it may not
        # rise above hi either (in the depth coordinate an end above x = 0 would carry density k); the
        # suffix-mass coordinate keeps its former result there (an ulp above hi, bit for bit)
        x = hi
    return x


def _emit(tok, hi, ln, npc, j, top, length):
    """Append the interval ``[top - length, top]`` of token ``j``; the new count."""
    tok[npc] = j
    hi[npc] = top
    ln[npc] = length
    return npc + 1


def layout_kernel(pD, zD, c, k, off):
    """Pieces ``(token, s_hi, length)`` of the block ``[c - sum(pD), c]`` (see the module docstring).

    Returns ``(tok, hi, ln, n_pieces)``; the arrays have room for ``2 m + 1``
    pieces and only the first ``n_pieces`` are meaningful.
    """
    m = pD.shape[0]
    cap = 2 * m + 2
    tok = np.empty(cap, dtype=np.int64)
    hi = np.empty(cap)
    ln = np.empty(cap)
    st_hi = np.empty(m + 1)
    st_lo = np.empty(m + 1)
    st_p = np.empty(m + 1)
    st_z = np.empty(m + 1)
    top = 0
    npc = 0
    sR = c
    for j in range(m):
        pj = pD[j]
        zj = zD[j]
        if _inc(pj, sR, k, off) >= zj:
            # the token fits in the right fragment: one interval [sig - pj, sig]
            sig = _solve(pj, zj, k, sR, off)
            npc = _emit(tok, hi, ln, npc, j, sig, pj)
            if sig < sR:
                st_hi[top] = sR
                st_lo[top] = sig
                st_p[top] = pj
                st_z[top] = zj
                top += 1
            elif top > 0:
                st_p[top - 1] += pj
                st_z[top - 1] += zj
            sR = sig - pj
            continue
        # the token spans back over free fragments of the stack
        w = pj
        dl = zj
        used = 0.0
        while top > 0:
            fh = st_hi[top - 1]
            fl = st_lo[top - 1]
            w += st_p[top - 1]
            dl += st_z[top - 1]
            if _inc(w, fh, k, off) >= dl:
                # the root lies in [fl, fh]: the check failed at the fragment above,
                # whose start is this fragment's end (a root below fl is rounding)
                sig = _solve(w, dl, k, fh, off)
                if sig < fl:
                    sig = fl
                if sig > fl:
                    npc = _emit(tok, hi, ln, npc, j, sig, sig - fl)
                    used += sig - fl
                if sig < fh:
                    st_lo[top - 1] = sig
                    st_p[top - 1] = w
                    st_z[top - 1] = dl
                else:
                    top -= 1
                    if top > 0:
                        st_p[top - 1] += w
                        st_z[top - 1] += dl
                break
            # the whole fragment goes to the token
            if fh > fl:
                npc = _emit(tok, hi, ln, npc, j, fh, fh - fl)
                used += fh - fl
            top -= 1
        rest = pj - used
        if rest > 0.0:
            npc = _emit(tok, hi, ln, npc, j, sR, rest)
            sR -= rest
    return tok, hi, ln, npc


#: The plain-Python kernel (its scalar helpers are the compiled ones when numba is there).
layout_kernel_py = layout_kernel
#: Whether the kernel is compiled by numba (the ``fast`` extra); compiled helpers rebind the module globals.
JIT = compile_in(globals(), ("_pw", "_inc", "_dinc", "_solve", "_emit", "layout_kernel"))
