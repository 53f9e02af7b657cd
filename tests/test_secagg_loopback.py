"""Secure aggregation through a real loopback SuperLink and SuperNodes (slow): three parties on
breast_cancer with pinned Ed25519 keys in their node configs. One deployment serves a plain run
(secagg=false, each party under another secagg-name) and, its SuperNodes restarted under their own
names, a secure run (secagg=true); the plain run equals the in-process engine (1e-9),
the secure run equals the in-process Flower path with secagg=true (the same fixed-point sums, 1e-9)
and the plain run to the stated quantization bound: every round's sum is within M/(2 scale) per
entry (docs/secagg.md), carried through ROUNDS rounds and one test-score sum. Then party 2's
SuperNode stops and a third run asks the other two for sums over {party0, party1}: each party's
ClientApp is a new process with a new Context, and only its own disk remembers the roster of the
secure run, so the run is refused there (one roster per party, ever). Every process is started in
its own session and stopped by process group; none is left. 111-140 s at load 10-20 on 2 cores."""

import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flower_vfl import VerticalADMM
from flower_vfl.deploy.local import (Processes, any_alive, free_port, loopback_env, start_supernode, submit,
                                     wait_run, write_connection)
from flower_vfl.io.data import labels, party_block
from flower_vfl.secagg import FixedPoint, public_key_hex, signing_key_pem

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")]
ROOT = Path(__file__).resolve().parents[1]
M, ROUNDS = 3, 4
# variant 'sharing-fixed': theta 1/M in the plain run as in the secure one (whose central node sees no
# party's own release to follow their alignment with)
RC = (f"dataset='breast_cancer' num-parties={M} max-rounds={ROUNDS} lam=0.0001 acceleration='none' "
      "variant='sharing-fixed' party-wait=120.0")


def node_config_arg(nc):
    """``--node-config`` text: TOML values, strings single-quoted (one argument, spaces allowed)."""
    return " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={str(v).lower()}" if isinstance(v, bool)
                    else f"{k}={v}" for k, v in nc.items())


def node_configs(tmp):
    """Each party: its own Ed25519 key file, the other two parties' public keys pinned, its own
    state-dir, and the explicit weakening secagg-require-all=false (the central node picks the
    roster of the first sum; docs/secagg.md), so that across runs only the party's own disk stands
    in the way of a sum over fewer parties."""
    keys = [Ed25519PrivateKey.generate() for _ in range(M)]
    out = {}
    for m, k in enumerate(keys):
        pem = tmp / f"party{m}.pem"
        pem.write_bytes(signing_key_pem(k))
        pem.chmod(0o600)
        out[m] = {"partition-id": m, "secagg-signing-key": str(pem),
                  "secagg-pins": ", ".join(f"party{j}={public_key_hex(keys[j])}" for j in range(M) if j != m),
                  "secagg-require-all": False, "state-dir": str(tmp / f"party{m}-state")}
    return out


class Deployment:
    """An insecure loopback SuperLink and one SuperNode per party (flower-vfl's SuperNode with a
    0.2 s idle poll, ClientApps forked by the warm executor), its own FLWR_HOME and ports."""

    def __init__(self, tmp, nodes):
        self.tmp, self.port = tmp, free_port()
        self.env = loopback_env(tmp / "flwr_home")
        self.conn = write_connection(tmp / "flwr_home", "loopback", f"127.0.0.1:{self.port}")
        self.procs = Processes(tmp / "logs")
        self.procs.start("superlink", ["flower-superlink", "--insecure", "--port", self.port,
                                       "--disable-runtime-dependency-installation"], self.env, tmp)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            time.sleep(0.2)
        for m, nc in nodes.items():
            start_supernode(self.procs, f"node{m}", f"127.0.0.1:{self.port}", node_config_arg(nc), self.env, tmp,
                            exec_name=f"exec{m}", idle_poll=0.2)

    def restart(self, nodes):
        """Each party's SuperNode stopped and started again with ``nodes`` (its node configs)."""
        for m in nodes:
            self.procs.stop(f"node{m}")
            self.procs.stop(f"exec{m}")
        for m, nc in nodes.items():
            start_supernode(self.procs, f"node{m}", f"127.0.0.1:{self.port}", node_config_arg(nc), self.env, self.tmp,
                            exec_name=f"exec{m}", idle_poll=0.2)

    def run(self, name, rc, completes=True):
        out = self.tmp / name
        run_id = submit(ROOT, self.conn, f"{rc} out-dir='{out}'", self.env)
        rec = wait_run(run_id, self.conn, self.env, self.tmp / "logs" / f"{name}.log", timeout=900, poll=0.5)
        if not completes:
            return None, rec
        assert rec["status"] == "finished:completed", rec
        return np.load(out / "decision_test.npy"), rec["log_lines"]


def in_process(nodes):
    """The engine (VerticalADMM, no Flower) and the Flower path on a LocalGrid with secagg=true
    (the real ClientApp handlers, the same node configs), in this process."""
    from flower_vfl.apps import client as ca
    from flower_vfl.apps.server import make_strategy
    from flower_vfl.deploy.local_grid import LocalGrid
    blocks = [party_block("breast_cancer", m, M) for m in range(M)]
    y, _ = labels("breast_cancer")
    engine = VerticalADMM(lam=1e-4, max_rounds=ROUNDS, tol=0, acceleration="none",
                          variant="sharing-fixed").fit([b[0] for b in blocks], y)
    cfg = {"dataset": "breast_cancer", "num-parties": M, "max-rounds": ROUNDS, "lam": 1e-4, "acceleration": "none",
           "variant": "sharing-fixed",
           "secagg": True, "party-wait": 5.0}
    handlers = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify,
                "query.secagg_keys": ca.secagg_keys}
    st = make_strategy(cfg)
    st.start(grid=LocalGrid(handlers, {100 + m: nc for m, nc in nodes.items()}, cfg), num_rounds=ROUNDS, timeout=120)
    return engine.decision_function([b[1] for b in blocks]), st.decision_test_


def test_secure_aggregation_through_a_real_superlink_equals_the_plain_run(tmp_path):
    nodes = node_configs(tmp_path)
    dep = None
    try:
        # a pinned party serves plain and secure runs under different secagg-names (docs/secagg.md, "One
        # roster per party, ever": a plain release is a sum over the party alone)
        dep = Deployment(tmp_path, {m: {**nc, "secagg-name": f"party{m}-plain"} for m, nc in nodes.items()})
        plain, _ = dep.run("plain", f"{RC} secagg=false")
        dep.restart(nodes)
        secure, log = dep.run("secure", f"{RC} secagg=true")
        dep.procs.stop("node2")
        dep.procs.stop("exec2")
        _, fewer = dep.run("fewer", RC.replace(f"num-parties={M}", "num-parties=2") + " secagg=true", completes=False)
    finally:
        if dep is not None:
            dep.procs.stop_all()
    assert any_alive(dep.procs.started) == []
    # the run over {party0, party1}: refused by the parties' own disks, before any sum
    assert fewer["status"] != "finished:completed"
    said = "\n".join(fewer["log_lines"])
    assert "secure aggregation: roster of 2 parties (0=party0, 1=party1)" in said, said[-3000:]
    assert ("refused: party 'party0' answers secure sums over one roster only, [party0,party1,party2] (recorded "
            "in its state folder at its first masked answer); refused in a sum over [party0,party1]") in said or \
        ("refused: party 'party1' answers secure sums over one roster only, [party0,party1,party2] (recorded "
         "in its state folder at its first masked answer); refused in a sum over [party0,party1]") in said, \
        said[-3000:]
    reference, secure_in_process = in_process(nodes)
    # the key agreement ran over the wire with the three pinned parties
    assert any("secure aggregation: roster of 3 parties (0=party0, 1=party1, 2=party2)" in ln for ln in log), \
        "\n".join(log[-40:])
    assert np.max(np.abs(plain - reference)) <= 1e-9
    # the same fixed-point sums as the in-process Flower path: the masks cancel exactly
    assert np.max(np.abs(secure - secure_in_process)) <= 1e-9
    # the quantization bound: each round's sum within M/(2 scale) per entry (scale from the default
    # secagg-bound 1e4 of every party: 2^38, 5.5e-12); ADMM carries it through ROUNDS rounds and one
    # test-score sum, allowed 100x per round as in tests/test_secagg_flower.py
    bound = FixedPoint([1e4] * M).error_bound
    diff = float(np.max(np.abs(secure - plain)))
    print(f"max |secure - plain| = {diff:.3g} (per-round bound {bound:.3g}, allowed {(ROUNDS + 1) * 100 * bound:.3g})")
    assert 0.0 < diff <= (ROUNDS + 1) * 100 * bound          # > 0: the releases went through fixed point
