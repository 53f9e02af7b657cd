"""Shared test set-up."""

import pytest


@pytest.fixture(autouse=True)
def _party_state_dir(tmp_path, monkeypatch):
    """Each test's private parties keep their ledger in their own fresh folder (the default,
    ~/.flower-vfl/party-state, is shared by every run on a machine, as a budget should be)."""
    monkeypatch.setenv("FLOWER_VFL_STATE_DIR", str(tmp_path / "party-state"))


def _installed_package_dir():
    """Where a fresh interpreter outside this checkout (as ``flwr run``, a SuperNode or a
    ClientApp process is) imports flower_vfl from, or None when it cannot."""
    import os
    import subprocess
    import sys
    import tempfile
    r = subprocess.run([sys.executable, "-c", "import flower_vfl, os; print(os.path.dirname(flower_vfl.__file__))"],
                       cwd=tempfile.gettempdir(), capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return os.path.realpath(r.stdout.strip()) if r.returncode == 0 else None


@pytest.hookimpl(trylast=True)         # after -m / -k have deselected
def pytest_collection_modifyitems(config, items):
    """The slow tests start Flower processes that import flower_vfl from the *installed*
    package: from another checkout (an editable install made elsewhere, e.g. by a CI clone's
    ``scripts/install.sh``) they would test that checkout's code. Refuse such a run up front."""
    if not any(it.get_closest_marker("slow") for it in items):
        return
    import os
    here = os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir, "flower_vfl"))
    there = _installed_package_dir()
    if there != here:
        raise pytest.UsageError(
            f"the slow tests run Flower processes that import flower_vfl from {there or 'nowhere (not installed)'}, "
            f"not from this checkout ({here}); run `pip install -e .` (or `bash scripts/install.sh`) here first, "
            "or deselect them with -m 'not slow'")
