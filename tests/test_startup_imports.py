"""Start-up of the README's job (issue 24, item 5): what a process of a run imports and reads
before round 1 (benchmarks/bench_startup.py measures the time)."""

import subprocess
import sys

import numpy as np
import pytest

HEAVY = ("sklearn", "dp_accounting", "scipy.stats")


def _loaded_after(code: str, tmp_path) -> list[str]:
    """The HEAVY modules a fresh interpreter has loaded after ``code`` (its own bundled cache)."""
    probe = code + f"\nimport sys\nprint('loaded:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {"FLOWER_VFL_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    last = out.stdout.splitlines()[-1]
    assert last.startswith("loaded:"), out.stdout
    return [m for m in last[len("loaded:"):].split(",") if m]


def test_apps_import_without_sklearn_or_accountant(tmp_path):
    # a party or central node without privacy never needs dp_accounting (~1 s with scipy.stats),
    # and the strategies need no scikit-learn (~1.3 s)
    assert _loaded_after("import flower_vfl.apps.client, flower_vfl.apps.server", tmp_path) == []


def test_bundled_split_read_without_sklearn_once_cached(tmp_path):
    load = "from flower_vfl.io.data import party_block, labels\nparty_block('breast_cancer', 0, 2)\nlabels('breast_cancer')"
    assert "sklearn" in _loaded_after(load, tmp_path)          # first use: the split is computed
    assert _loaded_after(load, tmp_path) == []                  # then read from the cache
    assert "sklearn" in _loaded_after("import flower_vfl.privacy.accounting as a\na.dpa()\n"
                                      "from flower_vfl.baselines import lam_to_C", tmp_path)


def test_bundled_split_is_sklearns_and_a_stale_cache_is_recomputed(tmp_path, monkeypatch):
    from sklearn.model_selection import train_test_split

    from flower_vfl.io import data
    monkeypatch.setenv("FLOWER_VFL_CACHE", str(tmp_path))
    y = np.where(np.arange(101) % 3 == 0, 1.0, -1.0)
    ref = train_test_split(np.arange(y.size), test_size=0.25, random_state=0, stratify=y)
    for _ in range(2):                                          # computed, then read
        tr, te = data._bundled_split(y)
        np.testing.assert_array_equal(tr, ref[0])
        np.testing.assert_array_equal(te, ref[1])
    y2 = -y                                                     # other labels: the cache is stale
    tr2, _ = data._bundled_split(y2)
    np.testing.assert_array_equal(tr2, train_test_split(np.arange(y.size), test_size=0.25, random_state=0,
                                                        stratify=y2)[0])
    (tmp_path / "breast_cancer.split.npz").write_bytes(b"not an npz")
    np.testing.assert_array_equal(data._bundled_split(y)[0], ref[0])


@pytest.mark.parametrize("name", ["lam_to_C", "centralized_logreg", "logreg_objective"])
def test_baselines_still_export_the_sklearn_helpers(name):
    import flower_vfl.baselines as b
    from flower_vfl.baselines import sklearn_baselines
    assert getattr(b, name) is getattr(sklearn_baselines, name)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        b.nope
