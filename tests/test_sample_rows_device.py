"""The device route of :func:`otspec.decoding._sampling.sample_rows`: the step back from a zero-mass entry holds for
any nondecreasing running sums (a GPU's ``torch.cumsum`` is a parallel scan: a zero-mass entry's running sum need
not equal its predecessor's), and the draw issues few ops."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from otspec.decoding import _sampling as S  # noqa: E402


def _step_back(c, P, u):
    """The rule written out: the first running sum above ``u`` times the total (clamped to the last entry), then
    back to the last positive entry (0 if none)."""
    out = []
    for b in range(P.shape[0]):
        i = min(int(np.searchsorted(c[b], u[b] * c[b, -1], side="right")), P.shape[1] - 1)
        while P[b, i] <= 0 and i > 0:
            i -= 1
        out.append(i)
    return out


@pytest.mark.parametrize("broadcast", [False, True])
def test_a_landing_on_a_zero_mass_entry_whose_running_sum_rose_steps_back(monkeypatch, broadcast):
    # running sums that rise at zero-mass entries (as a parallel scan's rounding may make them): uniforms landing in
    # those rises still give the last positive entry before them, as the rule written out does
    real = torch.cumsum
    bumps = {}

    def scan(x, dim, **kw):
        c = real(x, dim=dim, **kw)
        bump = torch.where(x > 0, 0.0, 0.05).cumsum(dim=dim)  # nondecreasing, rising only at zero-mass entries
        c = c + bump
        bumps["c"] = c
        return c

    r = np.random.default_rng(3)
    V, n = 12, 6
    for trial in range(30):
        P = r.random((1 if broadcast else n, V)) * (r.random((1 if broadcast else n, V)) < 0.5)
        P[:, 0] = 0.0  # a zero-mass first entry: a landing there has nothing to step back to
        P[:, r.integers(1, V)] += 0.3
        P /= P.sum(axis=1, keepdims=True)
        Pn = np.broadcast_to(P, (n, V))
        Pt = torch.from_numpy(P).expand(n, V) if broadcast else torch.from_numpy(P)
        u = r.random(n)
        monkeypatch.setattr(torch, "cumsum", scan)
        got = S.sample_rows(Pt, None, uniforms=torch.from_numpy(u)).tolist()
        monkeypatch.setattr(torch, "cumsum", real)
        c = bumps["c"].numpy().reshape(-1, V)  # a broadcast law's one running sum: a row (V,), or (1, V)
        c = np.broadcast_to(c[:1], (n, V)) if c.shape[0] == 1 else c
        want = _step_back(c, Pn, u)
        assert got == want, (trial, got, want)
        assert all(P[0 if broadcast else b, i] > 0 or i == 0 for b, i in enumerate(got))


def test_a_device_draw_issues_ten_ops_or_eleven_of_a_broadcast_law():
    # cumsum, the total, the scaled uniforms, searchsorted and the step back in one masked amax, with no arange, clamp
    # or copy of a broadcast law's running sums (before: 14 a draw of one law per row, 17 of one law broadcast, then
    # 12 with the broadcast law's row taken as a (1, V) slice)
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    P = torch.rand(4, 64, dtype=torch.float64)
    u = torch.rand(4, dtype=torch.float64)
    S.sample_rows(P, None, uniforms=u)  # the index row made once
    for law, bound in ((P, 10), (P[:1].expand(4, 64), 11)):
        ops.clear()
        with Count():
            S.sample_rows(law, None, uniforms=u)
        assert len(ops) <= bound, ops
