"""Anderson across a safeguard reset: the accelerator's in-place sweeps (core/accel.py: sweep 1 writes
Y's new row, sweep 2 writes S's new row just before it combines) give the iterates of a textbook
type-II Anderson whose memory is dropped at the round the safeguard fires, where that round and the
next are plain steps u+ = T(u) and the history restarts from the second (Anderson's docstring)."""

import numpy as np
import pytest

from flower_vfl.core.accel import Anderson
from test_round_kernels import anderson_reference_step


def _textbook(T_at, u0, mem, rounds, safeguard, reg=1e-10):
    """Type-II Anderson, u+ = T(u) - (S + Y) gamma (tests/test_round_kernels.py's reference), with
    the safeguard: when ||g|| > safeguard * min ||g|| since the last reset, the memory is dropped
    and u+ = T(u); the round after it is plain too (its g starts the new history). Returns the
    iterates and the rounds at which it reset."""
    u = T_at(0, u0)                              # the first call returns T(u)
    us, gs, out, resets, g_min = [], [], [u], [], np.inf
    for k in range(1, rounds + 1):
        Tu = T_at(k, u)
        g = Tu - u
        gn = float(np.linalg.norm(g))
        if gn > safeguard * g_min:
            us, gs, g_min = [], [], np.inf
            resets.append(k)
            u = Tu
            out.append(u.copy())
            continue
        g_min = min(g_min, gn)
        u = anderson_reference_step(us, gs, u, Tu, mem, reg)
        out.append(u.copy())
    return out, resets


@pytest.mark.parametrize("f32,chunk", [(False, None), (False, 7), (True, 64)])
def test_anderson_after_a_safeguard_reset_is_textbook_anderson_restarted(f32, chunk, monkeypatch):
    """A contracting affine map whose offset jumps at round 9 (the residual g jumps ~1000 times
    above its smallest value: the safeguard of 10 fires once, after the memory of 3 has wrapped):
    the 20 iterates equal the textbook reference's to 1e-9 (1e-6 with the float32 history),
    the reset at the same round, and the iteration heads for the new fixed point."""
    rng = np.random.default_rng(11)
    L = 240
    Q = np.linalg.qr(rng.normal(size=(L, L)))[0]
    Mx = Q @ np.diag(rng.uniform(0.2, 0.9, L)) @ Q.T
    b0, b1 = rng.normal(size=L), 1e3 * rng.normal(size=L)

    def T_at(k, u):
        return Mx @ u + (b0 if k < 9 else b0 + b1)

    if f32:
        monkeypatch.setattr(Anderson, "F32_MIN", 1)
    if chunk:
        monkeypatch.setattr(Anderson, "CHUNK", chunk)
    acc = Anderson(mem=3, safeguard=10.0)
    u0 = rng.normal(size=L)
    acc.u = acc._next(T_at(0, u0))
    got = [acc.u.copy()]
    for k in range(1, 21):
        acc.u = acc._next(T_at(k, acc.u.copy()))
        got.append(acc.u.copy())
    ref, resets = _textbook(T_at, u0, 3, 20, 10.0)
    assert resets == [9]
    assert acc.resets == 2                       # the first call counts as one
    tol = 1e-6 if f32 else 1e-9
    for a, r in zip(got, ref):
        assert np.max(np.abs(a - r)) <= tol * np.max(np.abs(r))
    fixed = np.linalg.solve(np.eye(L) - Mx, b0 + b1)
    assert np.max(np.abs(got[-1] - fixed)) <= 1e-2 * np.max(np.abs(got[9] - fixed))    # it moved
