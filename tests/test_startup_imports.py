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


def _tiny_a9a(folder, rows=(("+1", "3:1 70:1"), ("-1", "5:1 123:1"), ("-1", "1:1"))):
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("a9a", "a9a.t"):
        (folder / name).write_text("".join(f"{y} {x}\n" for y, x in rows))
    return folder


def test_a9a_labels_cached_for_the_label_owner(tmp_path, monkeypatch):
    # the ServerApp needs only the labels: parsed once (load_all's parse), then read without the
    # LIBSVM reader (scikit-learn) and without X; a changed file is parsed again
    from flower_vfl.io import data
    monkeypatch.setenv("FLOWER_VFL_CACHE", str(tmp_path / "cache"))
    d = _tiny_a9a(tmp_path / "a9a")
    y, yt = data.labels("a9a", str(d))
    np.testing.assert_array_equal(y, [1.0, -1.0, -1.0])
    _, y0, _, yt0 = data.load_all("a9a", str(d))
    assert y.dtype == y0.dtype and np.array_equal(y, y0) and np.array_equal(yt, yt0)
    assert len(list((tmp_path / "cache").glob("a9a.labels.*.npz"))) == 1
    code = (f"from flower_vfl.io.data import labels\ny, yt = labels('a9a', {str(d)!r})\n"
            "assert list(y) == [1.0, -1.0, -1.0], y")
    env_cache = tmp_path / "cache"
    probe = code + f"\nimport sys\nprint('loaded:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], capture_output=True, text=True, check=True,
                         env={"FLOWER_VFL_CACHE": str(env_cache), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                         timeout=120)
    assert out.stdout.splitlines()[-1] == "loaded:"
    import os
    _tiny_a9a(d, rows=(("-1", "3:1"), ("+1", "5:1"), ("+1", "2:1")))       # the file changed
    st = (d / "a9a").stat()
    os.utime(d / "a9a", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    np.testing.assert_array_equal(data.labels("a9a", str(d))[0], [-1.0, 1.0, 1.0])
    for f in (tmp_path / "cache").glob("a9a.labels.*.npz"):
        f.write_bytes(b"torn")                                                 # unreadable: parsed again
    np.testing.assert_array_equal(data.labels("a9a", str(d))[0], [-1.0, 1.0, 1.0])
    with pytest.raises(FileNotFoundError, match="a9a data file not found: .*nowhere/a9a. Set the node-config"):
        data.labels("a9a", str(tmp_path / "nowhere"))


def test_warm_plots_leaves_nothing_and_changes_no_pixel(tmp_path, monkeypatch):
    # the ServerApp draws a throwaway run while the rounds run (apps/server.warm_plots_thread): the
    # real run.png must be byte for byte what it is without the warm-up, and no folder is left
    import tempfile

    from flower_vfl.reporting import plots, warm
    from flower_vfl.reporting.report import write_report
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    hist = [{"round": k, "train_loss": 1.0 / k, "objective": 1.0 / k, "primal_residual": 2.0 / k,
             "dual_residual": 0.5 / k, "parties": 2, "elapsed_s": 0.1 * k} for k in range(1, 8)]
    write_report(tmp_path / "run", {"dataset": "a9a"}, hist, {"rounds": 7, "test_loss": 0.3, "test_accuracy": 0.8,
                                                             "wall_time_s": 1.0}, plot=False)
    cold = plots.plot_run(tmp_path / "run", tmp_path / "cold.png").read_bytes()
    warm.warm_plots()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert plots.plot_run(tmp_path / "run", tmp_path / "warm.png").read_bytes() == cold


def test_server_starts_the_warm_up_only_when_it_writes_outputs(tmp_path):
    from flower_vfl.apps.server import _join, warm_plots_thread
    assert warm_plots_thread({"out-dir": ""}) is None
    t = warm_plots_thread({"out-dir": str(tmp_path)})
    assert t.daemon and t.name == "flower-vfl-warm-plots"
    _join(t)
    assert not t.is_alive()
