"""Institutions on separate hosts (issue 23 item 4), emulated with network namespaces (slow).

The central node (SuperLink, ServerApp, the operator's ``flwr``) and each party run in their own
network namespace with their own address (10.23.0.1; party m 10.23.0.1m), their own folder
(Flower home, state-dir, keys) and only a point-to-point link to the central node. The central
node's CA signs a server certificate for 10.23.0.1 only; each party makes its own key pair, the
central node registers the public key and binds it to the party (``party-keys``). a9a runs end to
end and must give the in-process result to 1e-9, the tolerance tests/test_deploy_loopback.py
holds the loopback deployment to against the same reference, first over veth links and then
over WAN-like links (50 ms each way, 1 % packet loss each way, 20 Mbit/s: a user-space relay
between TUN devices plus the kernel's tbf, since this kernel has no netem; tests/_netns.py).

Skipped, with the reason, where the machine cannot: not root, no ``ip netns``/veth/TUN, no
Flower binaries, or no a9a under ../shared/data/a9a. Every namespace has a random suffix and is
deleted at the end (its links with it); every process started is stopped by process group.
"""

import json
from functools import lru_cache

import numpy as np
import pytest

import _netns as N
from flower_vfl import VerticalADMM
from flower_vfl.deploy.local import any_alive
from flower_vfl.io.data import labels, party_block

_WHY = N.unavailable() or (None if N.a9a_dir() else "a9a is not in ../shared/data/a9a")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_WHY is not None, reason=f"separate-host test: {_WHY}")]
N_TRAIN = 32561


@lru_cache(maxsize=4)
def reference(rounds):
    data = str(N.a9a_dir())
    blocks = [party_block("a9a", m, 2, data) for m in range(2)]
    y, _ = labels("a9a", data)
    m = VerticalADMM(lam=1e-4, max_rounds=rounds, tol=0).fit([b[0] for b in blocks], y)
    return m.decision_function([b[1] for b in blocks])


def _run(tmp_path, rounds, **link):
    hosts = N.Hosts(2, log_dir=tmp_path, **link)
    try:
        routes = {ns: hosts.routes(ns) for ns in (hosts.central, *hosts.parties)}
        res = N.deploy_hosts(tmp_path / "w", hosts, {"dataset": "a9a", "num-parties": 2, "max-rounds": rounds},
                             N.a9a_dir(), timeout=1500)
    finally:
        hosts.close()
    return hosts, routes, res


def _check(hosts, routes, res, rounds, tmp_path):
    assert res["record"]["status"] == "finished:completed", res["record"]
    f = np.load(res["out_dir"] / "decision_test.npy")
    assert np.max(np.abs(f - reference(rounds))) <= 1e-9
    assert len(json.loads((res["out_dir"] / "report.json").read_text())["rounds"]) == rounds
    # each party reaches the central node only: one route, no default route, no other host
    for m, ns in enumerate(hosts.parties):
        assert routes[ns] == [f"{N.LINK_IP} dev {hosts.dev_p[m]} proto kernel scope link src {N.party_ip(m)} "]
    assert sorted(routes[hosts.central]) == sorted(
        f"{N.party_ip(m)} dev {hosts.dev_c[m]} proto kernel scope link src {N.LINK_IP} " for m in range(2))
    # every party's released N-vectors crossed its own link (8 bytes a value, every round)
    end = res["snapshots"][-1][2]
    for m in range(2):
        assert end[m]["rx_bytes"] >= rounds * N_TRAIN * 8, end
    # own folders: each party's key, CA copy and state stay in its folder; the bound keys
    work = tmp_path / "w"
    keys = json.loads((work / "central" / "party-keys.json").read_text())
    assert keys == {str(m): res["fingerprints"][m] for m in range(2)} and len(set(keys.values())) == 2
    for m in range(2):
        assert (work / f"party{m}" / "pki" / "node.key").is_file()
        assert (work / f"party{m}" / "state" / "block-cache").is_dir()
    assert not list((work / "central").rglob("node.key"))
    assert any_alive(res["started"]) == []
    assert hosts.left() == []


def test_separate_hosts_over_veth_match_in_process(tmp_path):
    hosts, routes, res = _run(tmp_path, 3)
    _check(hosts, routes, res, 3, tmp_path)


def test_separate_hosts_over_wan_links_match_in_process(tmp_path):
    """50 ms each way, 1 % of packets dropped each way, 20 Mbit/s: TCP retransmits what the
    relay drops, so the result is still the in-process one (1e-9); the relay did drop packets."""
    hosts, routes, res = _run(tmp_path, 2, kind="wan", delay_ms=50, loss=0.01, rate="20mbit")
    _check(hosts, routes, res, 2, tmp_path)
    st = hosts.relay_stats
    assert st["forwarded"] > 1000 and 0.003 <= st["dropped"] / (st["forwarded"] + st["dropped"]) <= 0.03, st
