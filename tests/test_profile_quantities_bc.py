"""The one-op forms of the batched quantities' arithmetic give the floats of the forms they replace, bit for bit.

The profile's batched quantities (:mod:`otspec.multidraft._batched`, :mod:`otspec.profile._quantities_batched`) issue
fewer torch ops per position by writing the same float operations in fewer kernels: ``a - b / c`` as one
``addcdiv``, typical acceptance's Horner steps as ``c - acc * u``, k-Seq's grid candidates written into one buffer
and the last step taken by ``nextafter``, the bracket's first breakpoint and its presence by one ``max``, the split's
sums gathered after a column of zeros, constants kept on the device. Each is checked here against the form it
replaces (written out in the test: the independent route), on random and edge-case inputs, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
array_api_compat = pytest.importorskip("array_api_compat")

import otspec.multidraft._batched as MB  # noqa: E402
import otspec.profile._quantities_batched as QB  # noqa: E402

XT = array_api_compat.array_namespace(torch.zeros(1))  # torch's array-API namespace
XN = array_api_compat.array_namespace(np.zeros(1))


def _bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.int64)


def _same(a, b) -> bool:
    """The same floats to the last bit (NaN anywhere one is)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nan = np.isnan(a)
    return a.shape == b.shape and np.array_equal(nan, np.isnan(b)) and np.array_equal(_bits(a)[~nan], _bits(b)[~nan])


def _floats(r, n: int) -> np.ndarray:
    """Floats of every scale and sign, with zeros, subnormals and infinities among them."""
    x = r.standard_normal(n) * np.exp2(r.integers(-60, 60, n).astype(np.float64))
    x[r.random(n) < 0.05] = 0.0
    x[r.random(n) < 0.02] = 5e-324
    x[r.random(n) < 0.01] = np.inf
    return x


def test_sub_div_is_the_quotient_subtracted():
    # one addcdiv(a, b, c, value=-1) on torch against a - b / c, both routes, with broadcasting
    r = np.random.default_rng(0)
    for shape_a, shape_b, shape_c in (((4097,), (4097,), (4097,)), ((33, 1), (33, 1), (33, 511)), ((7, 9), (7, 9), (7, 1))):
        a, b, c = (_floats(r, math.prod(s)).reshape(s) for s in (shape_a, shape_b, shape_c))
        with np.errstate(all="ignore"):  # infinities and zeros among the inputs
            want = a - b / c
            on_numpy = MB._sub_div(a, b, c, XN)
        got = MB._sub_div(*(torch.from_numpy(x) for x in (a, b, c)), XT)
        assert _same(got.numpy(), want)
        assert _same(on_numpy, want)


def _horner_as_before(u, xp):
    """The host's Horner steps as the profile took them before: ``acc = acc * (-u) + 1/k`` from 0, ``k = 18 .. 2``."""
    acc = xp.zeros_like(u)
    neg = -u
    for k in range(18, 1, -1):
        acc = acc * neg + 1.0 / k
    return u * u * acc


@pytest.mark.parametrize("conv", [np.asarray, torch.from_numpy])
def test_h_series_takes_the_host_s_horner_steps(conv):
    r = np.random.default_rng(1)
    u = np.concatenate([r.uniform(-0.05, 0.05, 20000), [0.0, -0.0, 0.049999, -0.049999, 1e-300, -1e-300]])
    x = conv(u.copy())
    xp = array_api_compat.array_namespace(x)
    assert _same(np.asarray(QB._h_series(x, xp)), np.asarray(_horner_as_before(x, xp)))


def test_any_first_is_any_and_the_first_true_column():
    r = np.random.default_rng(2)
    for B, n, p in ((1, 1, 0.5), (13, 7, 0.2), (40, 300, 0.01), (5, 64, 0.0), (6, 64, 1.0)):
        g = r.random((B, n)) < p
        g[0] = False  # a row with none
        has, first = MB._any_first(torch.from_numpy(g), XT)
        assert np.array_equal(has.numpy(), g.any(-1, keepdims=True))
        want = np.where(g.any(-1, keepdims=True), np.argmax(g, -1)[:, None], 0)
        assert np.array_equal(first.numpy(), want)
        has_np, first_np = MB._any_first(g, array_api_compat.array_namespace(g))
        assert np.array_equal(np.asarray(has_np), g.any(-1, keepdims=True)) and np.array_equal(np.asarray(first_np), want)


@pytest.mark.parametrize("k", [2, 4, (2, 3, 4)])
def test_first_false_on_torch_is_the_counts_on_the_floats_bits(k):
    # the torch route (candidates in one buffer, the last step by nextafter) against the same rounds written on the
    # int64 bits as numpy takes them (the route before), every row, on random brackets and splits
    r = np.random.default_rng(3)
    B = 40
    ks = tuple(int(c) for c in r.choice(k, B)) if isinstance(k, tuple) else k
    for conv in (np.asarray, torch.from_numpy):
        xp = array_api_compat.array_namespace(conv(np.zeros(1)))
        arg = (conv(np.array(ks, dtype=np.float64)), ks) if isinstance(ks, tuple) else ks
        kf, power = MB._per_row_k(arg, B, xp)
        lo = conv(1.0 + r.random((B, 1)))
        hi = conv(np.minimum(np.asarray(lo) + r.random((B, 1)) * 2.0, float(max(k) if isinstance(k, tuple) else k)))
        Pl, Ql, Ph, Qh = (conv(r.random((B, 1))) for _ in range(4))
        got = np.asarray(MB._first_false(lo, hi, Pl, Ql, Ph, Qh, power, 4.0, xp))
        M = MB._grid_points(xp, lo)
        a = np.asarray(lo).view(np.int64).copy()
        for s in MB._grid_rounds(4.0, M):
            c = a + np.arange(s, s * (M + 1), s, dtype=np.int64)
            g = np.asarray(MB._go_up(conv(c.view(np.float64)), Pl, Ql, Ph, Qh, power, xp))
            a = a + g.sum(-1, keepdims=True) * s
        want = np.minimum(a + 1, np.asarray(hi).view(np.int64)).view(np.float64)
        assert _same(got, want)


def test_constants_and_index_rows_are_made_once_and_kept_unwritten():
    x = torch.zeros(3, dtype=torch.float64)
    one, again = MB._const(1.0, x), MB._const(1.0, x)
    assert one is again and one.shape == () and float(one) == 1.0 and one.dtype == torch.float64
    assert math.isnan(float(MB._const(math.nan, x))) and MB._const(math.nan, x) is MB._const(math.nan, x)
    assert MB._const(2.0, np.zeros(3)) == 2.0  # numpy: the Python number
    rows = MB._arange(3, 12, 3, x, XT)
    assert rows is MB._arange(3, 12, 3, x, XT) and rows.tolist() == [3, 6, 9] and rows.dtype == torch.int64
    # the profile's functions leave them as they were
    P = torch.from_numpy(np.random.default_rng(4).dirichlet(np.ones(9), 5))
    Q = torch.from_numpy(np.random.default_rng(5).dirichlet(np.ones(9), 5))
    for name in ("greedy-drafts", "top-k", "typical"):
        QB.acceptance_rows(name, P, Q, (1,) if name == "typical" else (1, 2, 3), XT)
    QB.kl_rows(Q, P, XT)
    assert float(MB._const(0.0, x)) == 0.0 and float(MB._const(1.0, x)) == 1.0 and float(MB._const(math.inf, x)) == math.inf
    assert MB._arange(0, 9, 1, x, XT).tolist() == list(range(9))


@pytest.mark.parametrize("seed", range(3))
def test_the_split_s_sums_gathered_after_zeros_are_the_old_where(seed):
    # Pl, Ql of _rho_star_rows: the cumulative sum's entry nb - 1, 0 where nb = 0 (the old clip, gather and where)
    r = np.random.default_rng(seed)
    B, V = 30, 17
    S = MB._ratio_sorted(*(torch.from_numpy(r.dirichlet(np.ones(V), B)) for _ in range(2)), XT)
    nb = torch.from_numpy(r.integers(0, V + 1, (B, 1)))
    got = MB._take_along(torch.cat([MB._zeros_column(B, S["ro"], XT), S["Pcum"]], -1), nb, XT)
    want = torch.where(nb > 0, S["Pcum"].gather(-1, (nb - 1).clamp(0, V - 1)), 0.0)
    assert _same(got.numpy(), want.numpy())
