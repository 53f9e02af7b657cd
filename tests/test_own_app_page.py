"""docs/own-app.md is a working app: its files, written from the page's `# file:` blocks, run in
Flower's simulation engine on a SuperLink of the test's own (`flower-superlink --simulation` on a
free port, own FLWR_HOME, no runtime dependency installation, stopped by process group: what the
page's "Run it" does) and give the in-process engine's model. Slow: 75 s measured at load ~13 on 2 cores."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "own-app.md"
FILE_BLOCK = re.compile(r"```(?:python|toml)\n# file: (\S+)\n(.*?)```", re.S)


def page_files() -> dict[str, str]:
    return {path: body for path, body in FILE_BLOCK.findall(PAGE.read_text())}


def test_the_page_has_every_file_of_the_app():
    files = page_files()
    assert sorted(files) == ["own_app/own_vfl_app/__init__.py", "own_app/own_vfl_app/client_app.py",
                             "own_app/own_vfl_app/data.py", "own_app/own_vfl_app/server_app.py",
                             "own_app/pyproject.toml"]
    import tomllib
    app = tomllib.loads(files["own_app/pyproject.toml"])["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "own_vfl_app.server_app:app", "clientapp": "own_vfl_app.client_app:app"}
    # every message kind the strategy sends without secagg has its handler
    client = files["own_app/own_vfl_app/client_app.py"]
    for handler in ('@app.query("identify")', "@app.train()", "@app.evaluate()"):
        assert handler in client


@pytest.mark.slow
def test_the_page_app_runs_and_gives_the_engines_model(tmp_path, monkeypatch):
    from flower_vfl.deploy import local
    for path, body in page_files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
    app, out, rounds = tmp_path / "own_app", tmp_path / "out", 12
    work = tmp_path / "work"
    work.mkdir()
    with local.simulation_superlink(work, {"FLOWER_VFL_STATE_DIR": str(tmp_path / "party-state")},
                                    command="test-own-app") as link:
        run_id = local.submit(app, link.connection, f"num-rounds={rounds} out-dir='{out}'", link.env,
                              federation_config="num-supernodes=2 client-resources-num-cpus=1")
        record = local.wait_run(run_id, link.connection, link.env, work / "run.log", timeout=900)
    log = (work / "run.log").read_text()
    assert record.get("status") == "finished:completed", log[-4000:]
    # a line for every round (the strategy's own log line), and the page's final line
    assert sorted({int(k) for k in re.findall(r"round (\d+): train_loss=", log)}) == list(range(1, rounds + 1)), \
        log[-3000:]
    assert "final: test_loss=" in log
    # the in-process engine on the same blocks, through the page's own data module
    monkeypatch.syspath_prepend(str(app))
    sys.modules.pop("own_vfl_app", None), sys.modules.pop("own_vfl_app.data", None)
    from own_vfl_app.data import load_labels, load_party_block
    from flower_vfl import VerticalADMM
    y_train, y_test = load_labels()
    blocks = [load_party_block(m, 2) for m in range(2)]
    model = VerticalADMM(lam=1e-4, max_rounds=rounds, tol=0).fit([b[0] for b in blocks], y_train)
    expected = model.decision_function([b[1] for b in blocks])
    np.testing.assert_allclose(np.load(out / "decision_test.npy"), expected, rtol=1e-9, atol=1e-12)
    assert np.mean((expected > 0) == (y_test == 1)) > 0.9        # a model, not noise
    sys.modules.pop("own_vfl_app", None), sys.modules.pop("own_vfl_app.data", None)
