"""BLAS threading and small dense products shared by the solvers and the central node.

:func:`one_blas_thread` limits BLAS/LAPACK to one thread for a block of work; :func:`mm` is a
small dense product in einsum's own loop. Both were in :mod:`flower_vfl.core.xsolve`, which
still re-exports them; here they sit below both x-update modules (xsolve, xsolve_prox), so
neither imports the other's helpers. No Flower imports.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["SMALL_MM", "one_blas_thread", "mm"]

#: d x d products up to this many entries run in einsum's own loop, not BLAS: with 2 OpenBLAS
#: threads on a loaded 2-core machine a 300 x 300 gemv stalled a round for ~30 ms
#: (benchmarks/bench_scale.py); above it the BLAS threads pay off
SMALL_MM = 1_000_000


_CONTROLLER = []
#: how deep this thread is in :func:`one_blas_thread` contexts: a nested one finds the libraries
#: at one thread already and touches nothing (a9a L1: ~460 support factorizations a fit each
#: enter one inside the x-update's; reading both libraries' thread counts was ~20 us a time)
_DEPTH = threading.local()


class _OneBlasThread:
    """Context: every loaded BLAS at one thread, restored on exit (see :func:`one_blas_thread`)."""

    __slots__ = ("libs", "old")

    def __init__(self, libs):
        self.libs, self.old = libs, None

    def __enter__(self):
        depth = getattr(_DEPTH, "n", 0)
        _DEPTH.n = depth + 1
        if depth:
            return self
        self.old = [lc.num_threads for lc in self.libs]
        for lc, n in zip(self.libs, self.old):
            if n != 1:
                lc.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        _DEPTH.n -= 1
        if self.old is not None:
            for lc, n in zip(self.libs, self.old):
                if n != 1:
                    lc.set_num_threads(n)
        return False


def one_blas_thread():
    """Context limiting BLAS/LAPACK to one thread (setup: Gram, eigh, Cholesky; the central
    node's N-vector kernels and Anderson's products over its history, every round).

    Measured on this 2-core machine under load (1-min load 15): eigh of a 300 x 300 Gram took
    1.4-10.8 s with OpenBLAS's 2 threads and 72-108 ms with 1; 1000 x 1000: 7-25 s vs 1.0-1.3 s;
    a 5 x 4M gemv (Anderson at 1M rows) 15.9 ms with 2 threads and 12.0 ms with 1 (it is memory
    bound). With the other core busy (1-min load 1.4) a dot of two a9a-sized N-vectors took
    855 us with 2 threads, 5.7 us with 1 (15.7 us in einsum's own loop). On a quiet machine
    1 thread costs at most the 2x of the second core. The ``threadpoolctl`` controller is built
    once per process and its BLAS library controllers are set directly (``threadpool_limits(1)``
    rescans the loaded libraries every time: 0.7-0.85 ms a call; ``limit`` on the cached
    controller ~10-26 us; this ~4 us), so the context is cheap enough for a per-round kernel."""
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
            ctl = ThreadpoolController()
            _CONTROLLER.append([lc for lc in ctl.lib_controllers if lc.user_api == "blas"])
        except ImportError:                  # pragma: no cover - shipped with scikit-learn
            _CONTROLLER.append([])
    return _OneBlasThread(_CONTROLLER[0])


def mm(A, B, trans=False):
    """A @ B (A^T @ B if ``trans``) for a small dense A without BLAS threads; B (d,) or (d, K)."""
    if A.size > SMALL_MM:
        return (A.T if trans else A) @ B
    spec = ("ji," if trans else "ij,") + ("j->i" if np.ndim(B) == 1 else "jk->ik")
    return np.einsum(spec, A, B)
