"""What a party's ClientApp process pays before its handler runs, checked in fresh interpreters
(``sys.modules`` and the environment, never timing).

On real nodes every message is a new ClientApp process: forked from the warm executor
(flower_vfl.deploy.warm_exec, which imported flwr, numpy, scipy and the app before the fork) or,
with Flower's own subprocess isolation, a new interpreter that imports the app module first. That
import must not load a library a non-private party's message never uses: scikit-learn, pandas,
pyarrow, torch / opacus, matplotlib, dp-accounting, scipy.optimize (the privacy calibration's root
finder) and scipy.stats. scipy.sparse, scipy.linalg and scipy.special do load: every train message
of a party uses them (its block is a scipy sparse matrix, the x-update and the losses use them), so
a lazy import would only move their cost into the handler.
"""

import json
import subprocess
import sys

#: never loaded by ``import flower_vfl.apps.client``
NOT_AT_IMPORT = ("sklearn", "pandas", "pyarrow", "torch", "opacus", "matplotlib", "dp_accounting",
                 "scipy.optimize", "scipy.stats")


def _fresh(code: str, tmp_path, env=None) -> str:
    base = {"FLOWER_VFL_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
            "PYTHONPATH": ":".join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                         env={**base, **(env or {})}, check=True, timeout=120)
    return out.stdout.splitlines()[-1]


def test_importing_the_clientapp_loads_no_library_a_public_partys_message_does_not_use(tmp_path):
    code = ("import sys\nimport flower_vfl.apps.client\nimport json\n"
            f"print(json.dumps([m for m in {NOT_AT_IMPORT!r} if m in sys.modules]))")
    assert json.loads(_fresh(code, tmp_path)) == []


def test_the_calibration_imports_its_root_finder_where_it_is_used(tmp_path):
    # the 'paper' calibration inverts Corollary 1 with scipy's brentq, now imported in the function:
    # the z it returns spends at most the asked epsilon, and within 1e-5 of it
    code = ("import sys\nimport flower_vfl.apps.client\nfrom flower_vfl.privacy.accounting import "
            "noise_multiplier_for, epsilon_spent\nz = noise_multiplier_for(1.0, 1e-5, 10, 'paper')\n"
            "print('scipy.optimize' in sys.modules, repr(epsilon_spent(z, 10, 1e-5, 'paper')))")
    loaded, eps = _fresh(code, tmp_path).split()
    assert loaded == "True" and 1.0 - 1e-5 < float(eps) <= 1.0


def test_the_warm_executor_sets_the_blas_thread_timeout_before_numpy_loads(tmp_path):
    """OpenBLAS reads $OPENBLAS_THREAD_TIMEOUT once, when it is loaded: the warm executor sets it
    before importing numpy, unless the operator set it; once numpy is loaded it sets nothing."""
    probe = ("import os\nfrom flower_vfl.deploy.warm_exec import blas_timeout_env, BLAS_THREAD_TIMEOUT\n"
             "{pre}print(blas_timeout_env(), os.environ.get('OPENBLAS_THREAD_TIMEOUT'), BLAS_THREAD_TIMEOUT)")
    assert _fresh(probe.format(pre=""), tmp_path) == "True 4 4"
    assert _fresh(probe.format(pre=""), tmp_path, {"OPENBLAS_THREAD_TIMEOUT": "20"}) == "False 20 4"
    assert _fresh(probe.format(pre="import numpy\n"), tmp_path) == "False None 4"


def test_the_zygote_sets_it_before_numpy_loads_for_the_executors_it_forks(tmp_path):
    """deploy-local's executors are forked from the zygote (flower_vfl.deploy.zygote), which imports
    numpy before it forks them: it sets the timeout first, so its executors and their ClientApps
    have it."""
    probe = ("import io, os, sys\nfrom flower_vfl.deploy import zygote\nsys.stdin = io.StringIO('')\n"
             "zygote.main()\nprint(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), 'numpy' in sys.modules)")
    assert _fresh(probe, tmp_path) == "4 True"
