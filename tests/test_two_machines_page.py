"""docs/two-machines.md, run as written on loopback: every ```bash block of the page, in order,
in the folder of the "machine" its `# on:` line names (hospital/, clinic/: each its own working
folder and FLWR_HOME), with the two hand-offs the page asks for done by copying (the CA
certificate to the clinic, the clinic's public key to the operator). Blocks marked "(keeps
running)" are started in their own process group and stopped by it at the end. Substituted for
loopback: the SuperLink's name -> 127.0.0.1, `--host 0.0.0.0` -> 127.0.0.1, the ports 9092/9094/9095
-> free ports. Then the model and the predictions are the in-process engine's on the same aligned,
standardized rows. Slow: 5 min 13 s measured at load ~13 on 2 cores (a 10-round run and a predict job on real
SuperNodes with TLS and registered keys)."""

import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "two-machines.md"
BLOCK = re.compile(r"```bash\n# on: ([a-z ]+?)( \(keeps running\))?\n(.*?)```", re.S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_blocks():
    """[(machines, keeps_running, script)] in page order."""
    return [(who.split(" and "), bool(bg), body) for who, bg, body in BLOCK.findall(PAGE.read_text())]


def test_every_command_block_names_its_machine():
    text = PAGE.read_text()
    assert len(page_blocks()) == text.count("```bash") == 12
    assert {m for who, _, _ in page_blocks() for m in who} == {"hospital", "clinic"}
    # the roles come first, then the certificates
    assert text.index("## Roles") < text.index("## Certificates and keys") < text.index("## The run")


def _read(path, label):
    with open(path) as fh:
        rows = list(csv.reader(fh))
    head, body = rows[0], rows[1:]
    ids = [r[0] for r in body]
    start = 2 if label else 1
    X = np.array([[float(v) for v in r[start:]] for r in body])
    y = np.array([int(r[1]) for r in body]) if label else None
    return head, ids, X, y


@pytest.mark.slow
def test_the_page_runs_on_loopback(tmp_path):
    from flower_vfl import VerticalADMM
    from sklearn.preprocessing import StandardScaler
    ports = {"9092": str(_free_port()), "9094": str(_free_port()), "9095": str(_free_port())}
    machines = {m: tmp_path / m for m in ("hospital", "clinic")}
    env = {}
    for m, folder in machines.items():
        folder.mkdir()
        env[m] = dict(os.environ, FLWR_HOME=str(folder / ".flwr"), XDG_CACHE_HOME=str(folder / ".cache"),
                      PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        env[m].pop("FLOWER_VFL_APP_DIR", None)
    running, log = [], []

    def loopback(script):
        script = script.replace("superlink.example.org", "127.0.0.1").replace("--host 0.0.0.0", "--host 127.0.0.1")
        for old, new in ports.items():
            script = re.sub(rf"\b{old}\b", new, script)
        return script

    def hand_offs():
        ca, pub = machines["hospital"] / "pki" / "ca.crt", machines["clinic"] / "keys" / "clinic.pub"
        if ca.exists() and not (machines["clinic"] / "ca.crt").exists():
            shutil.copy(ca, machines["clinic"] / "ca.crt")
        if pub.exists() and not (machines["hospital"] / "clinic.pub").exists():
            shutil.copy(pub, machines["hospital"] / "clinic.pub")

    try:
        for i, (who, keeps_running, script) in enumerate(page_blocks()):
            for m in who:
                script_m = loopback(script)
                if keeps_running:
                    out = open(tmp_path / f"block{i}-{m}.log", "w")
                    running.append(subprocess.Popen(["bash", "-c", script_m], cwd=machines[m], env=env[m], stdout=out,
                                                    stderr=subprocess.STDOUT, start_new_session=True))
                    if "flower-superlink" in script_m:
                        _wait_listening(int(ports["9092"]), running[-1], tmp_path / f"block{i}-{m}.log")
                    continue
                res = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script_m], cwd=machines[m], env=env[m],
                                     capture_output=True, text=True, timeout=1500)
                log.append(f"--- block {i} on {m}\n{res.stdout}\n{res.stderr}")
                (tmp_path / "blocks.log").write_text("\n".join(log))
                assert res.returncode == 0, f"block {i} on {m} failed:\n{script_m}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
                for p in running:
                    assert p.poll() is None, f"{p.args[-1][:60]} exited {p.returncode}: see {tmp_path}"
            hand_offs()
    finally:
        for p in running:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in running:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    hospital, clinic = machines["hospital"], machines["clinic"]
    # each owner's part of the model on its own disk, nobody else's
    assert sorted(p.name for p in (hospital / "model").glob("*.npz")) == ["label-owner.npz", "party-0.npz"]
    assert sorted(p.name for p in (clinic / "model").glob("*.npz")) == ["party-1.npz"]
    # the in-process engine on the same rows: the label owner's order of the common IDs, each
    # party's columns standardized with its own aligned training rows
    _, h_ids, h_X, y = _read(hospital / "hospital.csv", label=True)
    _, c_ids, c_X, _ = _read(clinic / "clinic.csv", label=False)
    cpos = {v: k for k, v in enumerate(c_ids)}
    keep = [k for k, v in enumerate(h_ids) if v in cpos]
    assert len(keep) == 436 and len(c_ids) == 455      # the 19 patients the hospital lacks are not trained on
    blocks = [h_X[keep], c_X[[cpos[h_ids[k]] for k in keep]]]
    scalers = [StandardScaler().fit(b) for b in blocks]
    model = VerticalADMM(lam=1e-4, max_rounds=10, tol=0).fit([s.transform(b) for s, b in zip(scalers, blocks)], y[keep])
    _, hn_ids, hn_X, _ = _read(hospital / "hospital-new.csv", label=False)
    _, cn_ids, cn_X, _ = _read(clinic / "clinic-new.csv", label=False)
    npos = {v: k for k, v in enumerate(cn_ids)}
    new = [hn_X, cn_X[[npos[v] for v in hn_ids]]]
    expected = model.decision_function([s.transform(b) for s, b in zip(scalers, new)])
    with open(hospital / "model" / "predictions.csv") as fh:
        pred = list(csv.DictReader(fh))
    assert [r["patient"] for r in pred] == hn_ids                  # every new patient, in the label owner's order
    np.testing.assert_allclose([float(r["score"]) for r in pred], expected, rtol=1e-7, atol=1e-9)
    truth = load_truth(hn_ids)
    assert np.mean((expected > 0) == (truth == 1)) > 0.9      # a model, not noise


def load_truth(ids):
    from sklearn.datasets import load_breast_cancer
    _, y = load_breast_cancer(return_X_y=True)
    return np.array([y[int(i[1:])] for i in ids])


def _wait_listening(port, proc, log, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"flower-superlink exited {proc.returncode}:\n{Path(log).read_text()[-3000:]}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise AssertionError(f"flower-superlink not listening on {port} within {timeout} s")
