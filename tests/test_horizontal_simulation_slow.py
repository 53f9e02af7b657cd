"""Horizontal DP-IADMM through `flwr run` in Flower's simulation engine (slow)."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

APP_TOML = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "hz-dpiadmm-test"
version = "0.1.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "flower-vfl"

[tool.flwr.app.components]
serverapp = "flower_vfl.apps.horizontal:server"
clientapp = "flower_vfl.apps.horizontal:client"

[tool.flwr.app.config]
hz-variant = "objt"
hz-iterations = 3
hz-num-agents = 3
hz-split = "iid"
hz-dirichlet-alpha = 0.5
hz-a = 1.0
hz-beta = 1e-6
hz-trust = "paper"
hz-eval-every = 1
out-dir = ""
"""


@pytest.mark.slow
def test_flwr_run_simulation_equals_engine(tmp_path):
    """A user's own app (its pyproject names flower_vfl.apps.horizontal' pair) run by
    `flwr run` in the simulation engine: 3 agents load their own Fashion-MNIST partitions;
    w after 3 non-private ObjT rounds equals the in-process engine's (1e-9)."""
    if shutil.which("flwr") is None:
        pytest.skip("flwr CLI not on PATH")
    from test_flower import _own_local_superlink, _stop_local_superlink

    from flower_vfl.datasets import load_fashion_mnist
    from flower_vfl.horizontal import DPIADMMParams, run_dpiadmm
    from flower_vfl.horizontal.data import split_arrays

    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(APP_TOML)
    home = tmp_path / "flwr_home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n')
    env = _own_local_superlink(dict(os.environ, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1"), home)
    out = tmp_path / "out"
    cmd = ["flwr", "run", str(app), "local", "--stream", "--federation-config", "num-supernodes=3",
           "--run-config", f"out-dir='{out}'"]
    try:
        proc = subprocess.run(cmd, cwd=app, env=env, capture_output=True, text=True, timeout=900)
    finally:
        _stop_local_superlink(home)
    assert (out / "w.npy").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    X, y, _, _ = load_fashion_mnist()
    Xp, yp = split_arrays(X, y, 3, "iid")
    res = run_dpiadmm(Xp, yp, DPIADMMParams(variant="objt"), 3, [[0, 0, 0]], K=10)
    assert np.max(np.abs(np.load(out / "w.npy") - res.W[0])) <= 1e-9
