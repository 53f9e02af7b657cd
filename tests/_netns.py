"""Institutions on separate hosts, emulated with Linux network namespaces (issue 23 item 4).

One namespace for the central node (SuperLink + ServerApp + the operator's ``flwr`` commands)
and one per party, each with its own address, its own folder (Flower home, state-dir, keys)
and nothing but a point-to-point link to the central node: the party namespaces have no route
anywhere else, so the run's traffic cannot leave the namespaces made here.

Two kinds of link:

- ``veth``: a veth pair per party (the kernel's own path; a LAN);
- ``wan``: a TUN device at each end, and a relay process (:func:`relay_main`, started by
  :class:`Hosts`) that copies IP packets between the two ends after a fixed delay and drops
  each one with a given probability, independently in each direction; bandwidth is limited by
  the kernel's ``tbf`` qdisc on every TUN device. This stands in for ``tc netem``, which this
  machine's kernel lacks ("Specified qdisc kind is unknown"): the loss is real IP packet loss
  (TCP sees it and retransmits), the delay is applied per packet in user space.

PKI (:func:`issue_pki`): the central node makes a CA and a server certificate for its own
address only; each institution makes its own P-384 key pair in its own folder and hands over
only the public key, which the central node registers (``flwr supernode register``) and binds
to the party (``party-keys``).

Every namespace has a random suffix; :meth:`Hosts.close` stops the processes started here (by
process group) and deletes only the namespaces made here (their veth/TUN devices go with them).
"""

from __future__ import annotations

import datetime
import hashlib
import heapq
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK_IP = "10.23.0.1"
PORT = 8000                      # the SuperLink's one HTTP API (Fleet + Control), flwr 1.42
CLIENTAPPIO_PORT = 9094          # each SuperNode's local Runtime API (inside its own namespace)


def party_ip(m: int) -> str:
    return f"10.23.0.{10 + m}"


def _ip(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why this machine cannot run the namespace tests (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    for tool in ("ip", "tc", "flower-superlink", "flwr"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun"
    name = f"fvlprobe{secrets.token_hex(3)}"
    try:
        res = _ip("netns", "add", name, check=False)
        if res.returncode != 0:
            return f"`ip netns add` fails here: {res.stderr.strip()}"
        res = _ip("-n", name, "link", "add", "vp0", "type", "veth", "peer", "name", "vp1", check=False)
        if res.returncode != 0:
            return f"veth pairs cannot be made here: {res.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


def a9a_dir() -> Path | None:
    d = ROOT.parent / "shared" / "data" / "a9a"
    return d if (d / "a9a").is_file() and (d / "a9a.t").is_file() else None


# --------------------------------------------------------------------------------------- PKI

def issue_pki(central: Path, parties: list[Path], link_ip: str = LINK_IP) -> dict:
    """The central node's CA + server certificate (SAN: ``link_ip`` only) in ``central/pki``;
    each institution's own key pair in ``<party>/pki`` (the private key never leaves it); the
    CA certificate copied to each institution and each public key to ``central/registered``.
    Returns paths and each key's SHA-256 fingerprint (of its PEM SubjectPublicKeyInfo, as the
    SuperLink reports a node's key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    pki = central / "pki"
    pki.mkdir(parents=True, exist_ok=True)

    def private(key, path, fmt):
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()))
        path.chmod(0o600)

    def cert(subject, issuer, pub, sign_key, ca, sans=None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(sign_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "central node CA (netns test)")])
    ca_pem = cert(ca_name, ca_name, ca_key.public_key(), ca_key, True).public_bytes(serialization.Encoding.PEM)
    srv_key = ec.generate_private_key(ec.SECP384R1())
    srv = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, link_ip)]), ca_name, srv_key.public_key(),
               ca_key, False, [x509.IPAddress(ipaddress.ip_address(link_ip))])
    out = {"ca": pki / "ca.crt", "cert": pki / "server.pem", "key": pki / "server.key", "nodes": []}
    out["ca"].write_bytes(ca_pem)
    private(ca_key, pki / "ca.key", serialization.PrivateFormat.PKCS8)
    out["cert"].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    private(srv_key, out["key"], serialization.PrivateFormat.PKCS8)
    reg = central / "registered"
    reg.mkdir(exist_ok=True)
    for m, folder in enumerate(parties):
        own = folder / "pki"
        own.mkdir(parents=True, exist_ok=True)
        (own / "ca.crt").write_bytes(ca_pem)
        k = ec.generate_private_key(ec.SECP384R1())
        private(k, own / "node.key", serialization.PrivateFormat.OpenSSH)
        pub = k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        (own / "node.key.pub").write_bytes(pub)
        (reg / f"party{m}.pub").write_bytes(pub)
        spki = k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        out["nodes"].append({"private": own / "node.key", "ca": own / "ca.crt", "registered": reg / f"party{m}.pub",
                             "fingerprint": hashlib.sha256(spki).hexdigest()})
    return out


# ----------------------------------------------------------------------------------- hosts

class Hosts:
    """``central`` + ``num_parties`` namespaces linked point to point (``kind`` 'veth' or 'wan').

    ``wan``: ``delay_ms`` each way, ``loss`` (probability a packet is dropped, each direction),
    ``rate`` (tbf rate on every TUN device, e.g. '20mbit'; None: unlimited)."""

    def __init__(self, num_parties: int, kind="veth", delay_ms=0.0, loss=0.0, rate=None, log_dir=None, seed=None):
        if kind not in ("veth", "wan"):
            raise ValueError(f"kind={kind!r}; choose 'veth' or 'wan'")
        self.suffix = secrets.token_hex(3)
        self.central = f"fvl{self.suffix}-c"
        self.parties = [f"fvl{self.suffix}-p{m}" for m in range(num_parties)]
        self.kind, self.rate = kind, rate
        self.link = {"delay_ms": float(delay_ms), "loss": float(loss), "rate": rate}
        self.made: list[str] = []
        self.relay: subprocess.Popen | None = None
        self.relay_log: Path | None = None
        self.relay_stats: dict = {}     # after close: packets forwarded and dropped by the relay
        #                                 under the last link setting
        self.periods: list[dict] = []    # one per link setting: the setting + the relay's counts
        # device names (<= 15 chars): central end / party end of party m's link
        self.dev_c = [f"v{self.suffix}c{m}" for m in range(num_parties)]
        self.dev_p = [f"v{self.suffix}p{m}" for m in range(num_parties)]
        try:
            for ns in (self.central, *self.parties):
                _ip("netns", "add", ns)
                self.made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            if kind == "veth":
                for m, ns in enumerate(self.parties):
                    _ip("link", "add", self.dev_c[m], "netns", self.central, "type", "veth",
                        "peer", "name", self.dev_p[m], "netns", ns)
            else:
                self._start_relay(delay_ms, loss, log_dir, seed)
            for m, ns in enumerate(self.parties):
                self._address(self.central, self.dev_c[m], LINK_IP, party_ip(m))
                self._address(ns, self.dev_p[m], party_ip(m), LINK_IP)
        except BaseException:
            self.close()
            raise

    def _address(self, ns, dev, local, peer):
        _ip("-n", ns, "addr", "add", f"{local}/32", "peer", f"{peer}/32", "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        self._tbf(ns, dev, self.rate)

    @staticmethod
    def _tbf(ns, dev, rate):
        if rate:
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                            "burst", "32kb", "latency", "400ms"], check=True, capture_output=True, text=True)
        else:                          # back to the default qdisc (none to delete is fine)
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True, text=True)

    def set_link(self, delay_ms=None, loss=None, rate=...) -> dict:
        """Change every link at run time (the processes and their connections stay): the relay's
        delay each way and loss probability (``wan`` only), the tbf rate on every device
        (``None``: unlimited; ``...``: unchanged). Returns the finished period: the previous
        setting and what the relay forwarded and dropped under it (``{}`` counts for veth)."""
        if self.kind != "wan" and (delay_ms or loss):
            raise ValueError("delay and loss need kind='wan' (the relay); veth links take only a rate")
        new = dict(self.link)
        if delay_ms is not None:
            new["delay_ms"] = float(delay_ms)
        if loss is not None:
            new["loss"] = float(loss)
        if rate is not ...:
            new["rate"] = rate
            for m, ns in enumerate(self.parties):
                self._tbf(self.central, self.dev_c[m], rate)
                self._tbf(ns, self.dev_p[m], rate)
        stats = {}
        if self.relay is not None:
            self.relay.stdin.write(json.dumps({"delay_ms": new["delay_ms"], "loss": new["loss"]}).encode() + b"\n")
            self.relay.stdin.flush()
            line = self.relay.stdout.readline()
            try:
                stats = json.loads(line)
            except ValueError:
                raise RuntimeError(f"the WAN relay did not take the new setting: {line!r}; see {self.relay_log}")
        period = dict(self.link, **stats)
        self.periods.append(period)
        self.link, self.rate = new, new["rate"]
        return period

    def _start_relay(self, delay_ms, loss, log_dir, seed):
        pairs = [f"{self.central}:{self.dev_c[m]}:{ns}:{self.dev_p[m]}" for m, ns in enumerate(self.parties)]
        self.relay_log = Path(log_dir or "/tmp") / f"relay-{self.suffix}.log"
        log = open(self.relay_log, "ab")
        self.relay = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--delay-ms", str(delay_ms),
                                       "--loss", str(loss), "--seed", str(seed if seed is not None else -1), *pairs],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                      start_new_session=True)
        log.close()
        line = self.relay.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the WAN relay did not start: {line!r}; see its log")

    def exec_cmd(self, ns, cmd) -> list[str]:
        return ["ip", "netns", "exec", ns, *[str(c) for c in cmd]]

    def counters(self) -> dict:
        """Bytes and packets through each link, counted on the central node's end."""
        out = {}
        for m in range(len(self.parties)):
            st = json.loads(_ip("-n", self.central, "-s", "-j", "link", "show", "dev", self.dev_c[m]).stdout)[0]
            s = st.get("stats64", st.get("stats"))
            out[m] = {"rx_bytes": s["rx"]["bytes"], "tx_bytes": s["tx"]["bytes"],
                      "rx_packets": s["rx"]["packets"], "tx_packets": s["tx"]["packets"]}
        return out

    def routes(self, ns) -> list[str]:
        return [r for r in _ip("-n", ns, "route", "show").stdout.splitlines() if r.strip()]

    def close(self):
        if self.relay is not None:
            try:
                os.killpg(self.relay.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.relay.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.relay.pid, signal.SIGKILL)
                self.relay.wait()
            self.relay.stdout.close()
            self.relay.stdin.close()
            self.relay = None
            lines = [x for x in self.relay_log.read_text().splitlines() if x.startswith("{")]
            self.relay_stats = json.loads(lines[-1]) if lines else {}
            self.periods.append(dict(self.link, **self.relay_stats))
        for ns in reversed(self.made):     # only the namespaces made here
            _ip("netns", "del", ns, check=False)
        self.made = []

    def left(self) -> list[str]:
        """Namespaces with this instance's suffix that still exist (should be none after close)."""
        return [n.split()[0] for n in _ip("netns", "list").stdout.splitlines() if f"fvl{self.suffix}-" in n]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------------------ deployment

def operator_env(folder: Path, ns: str, env: dict) -> dict:
    """An environment whose ``flwr`` runs inside ``ns`` (the operator works on the central
    host): a one-line wrapper first on PATH, so ``flower_vfl.deploy.local.submit/wait_run``
    work unchanged."""
    bin_dir = folder / "operator-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    real = shutil.which("flwr", path=str(Path(sys.executable).parent)) or shutil.which("flwr")
    wrapper = bin_dir / "flwr"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {ns} "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return dict(env, PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]))


class Deployment:
    """SuperLink (TLS, node authentication) in ``hosts.central``, one SuperNode (+ warm
    executor) per party in its own namespace with its own Flower home, state-dir and key, all
    started once; :meth:`run` submits one run from the operator on the central host (any number
    of runs, e.g. before and after :meth:`Hosts.set_link`). A context manager: leaving it stops
    every process started here (by process group)."""

    def __init__(self, workdir, hosts: Hosts, data_dir):
        from flower_vfl.deploy.local import Processes, _flwr_json, _node_config, write_connection

        self.hosts, self.data_dir = hosts, str(data_dir)
        self.workdir = workdir = Path(workdir).resolve()
        self.central = central = workdir / "central"
        parties = [workdir / f"party{m}" for m in range(len(hosts.parties))]
        self.logs = logs = workdir / "logs"
        pki = issue_pki(central, parties)
        self.fingerprints = [n["fingerprint"] for n in pki["nodes"]]
        base = dict(os.environ, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                    FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.2")
        base["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "")])
        c_env = dict(base, FLWR_HOME=str(central / "flwr_home"))
        self.conn = write_connection(central / "flwr_home", "central", f"{LINK_IP}:{PORT}", pki["ca"])
        self.op_env = operator_env(central, hosts.central, c_env)
        self.procs = procs = Processes(logs)
        self.runs = 0
        try:
            procs.start("superlink", hosts.exec_cmd(hosts.central, [
                "flower-superlink", "--host", LINK_IP, "--port", PORT, "--disable-runtime-dependency-installation",
                "--ssl-ca-certfile", pki["ca"], "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"],
                "--enable-supernode-auth", "--database", central / "superlink.db"]), c_env, central)
            _wait_listen(hosts, procs.procs["superlink"], logs / "superlink.log")
            for m in range(len(parties)):
                res = _flwr_json(["supernode", "register", str(pki["nodes"][m]["registered"]), self.conn],
                                 self.op_env)
                if not res.get("success", True):
                    raise RuntimeError(f"flwr supernode register failed for party {m}: {res}")
            self.keys = central / "party-keys.json"
            self.keys.write_text(json.dumps({str(m): f for m, f in enumerate(self.fingerprints)}))
            for m, (ns, folder) in enumerate(zip(hosts.parties, parties)):
                p_env = dict(base, FLWR_HOME=str(folder / "flwr_home"), FLOWER_VFL_STATE_DIR=str(folder / "state"))
                nc = {"partition-id": m, "data-dir": self.data_dir, "state-dir": str(folder / "state")}
                procs.start(f"node{m}", hosts.exec_cmd(ns, [
                    sys.executable, "-m", "flower_vfl.deploy.supernode", "--idle-poll", "0.5",
                    "--superlink", f"{LINK_IP}:{PORT}", "--root-certificates", pki["nodes"][m]["ca"],
                    "--auth-supernode-private-key", pki["nodes"][m]["private"], "--isolation", "process",
                    "--port", CLIENTAPPIO_PORT, "--node-config", _node_config(nc)]), p_env, folder)
                procs.start(f"exec{m}", hosts.exec_cmd(ns, [
                    sys.executable, "-m", "flower_vfl.deploy.warm_exec", "--insecure",
                    "--runtime-api-address", f"127.0.0.1:{CLIENTAPPIO_PORT}"]), p_env, folder)
            _wait_nodes(logs, len(parties), procs)
        except BaseException:
            self.close()
            raise

    @property
    def started(self) -> list[int]:
        return list(self.procs.started)

    def run(self, run_config: dict, name=None, timeout=1800.0, idle_s=0.0, on_round=None) -> dict:
        """One run (out-dir ``central/out-<name>``). Returns the run record, out dir, the link
        counters at every round (``snapshots``: ``[(round, monotonic_s, counters)]``, round 0 at
        submission, -1 before ``idle_s`` seconds of idle SuperNodes, ``"end"`` after) and the
        wall seconds from submission to the finished record."""
        import threading
        from flower_vfl.deploy.local import _node_config, submit, wait_run

        self.runs += 1
        name = name or f"run{self.runs}"
        out_dir = self.central / f"out-{name}"
        run_config = dict(run_config, **{"out-dir": str(out_dir), "data-dir": self.data_dir,
                                         "party-keys": str(self.keys)})
        snaps = []
        hosts = self.hosts
        if idle_s:
            snaps.append((-1, time.monotonic(), hosts.counters()))
            time.sleep(idle_s)
        snaps.append((0, time.monotonic(), hosts.counters()))
        report = out_dir / "report.json"
        stop = threading.Event()

        def watch():
            seen = 0
            while not stop.is_set():
                try:
                    k = len(json.loads(report.read_text()).get("rounds", []))
                except (OSError, ValueError):
                    k = seen
                if k > seen:
                    snaps.append((k, time.monotonic(), hosts.counters()))
                    seen = k
                    if on_round:
                        on_round(k)
                stop.wait(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t0 = time.monotonic()
        try:
            run_id = submit(ROOT, self.conn, _node_config(run_config), self.op_env)
            # poll 5 s: each status poll is a `flwr ls` (a Python start, ~1 s of CPU on a loaded box)
            record = wait_run(run_id, self.conn, self.op_env, self.logs / f"run-{name}.log", timeout=timeout,
                              poll=5.0)
        finally:
            stop.set()
            watcher.join(5)
        snaps.append(("end", time.monotonic(), hosts.counters()))
        return {"record": record, "run_id": run_id, "out_dir": out_dir, "logs": self.logs, "snapshots": snaps,
                "wall_s": time.monotonic() - t0, "fingerprints": list(self.fingerprints), "started": self.started}

    def close(self, grace=10.0):
        """Stop every process group started here, all at once (SIGTERM, then SIGKILL after
        ``grace`` s): one after the other, each warm executor's group waited out its timeout
        while its SuperNode was already gone (~1 min of teardown at load)."""
        import threading
        threads = [threading.Thread(target=self.procs.stop, args=(name, signal.SIGTERM, grace))
                   for name in list(self.procs.procs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.procs.stop_all()            # nothing left; kept for anything adopted

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def deploy_hosts(workdir, hosts: Hosts, run_config: dict, data_dir, timeout=1800.0, idle_s=0.0,
                 on_round=None) -> dict:
    """:class:`Deployment` for one run (out-dir ``central/out-run1``), everything stopped after."""
    with Deployment(workdir, hosts, data_dir) as dep:
        return dep.run(run_config, timeout=timeout, idle_s=idle_s, on_round=on_round)


def link_bytes(res, m, key="rx_bytes") -> int:
    """Bytes through party ``m``'s link during one run (from submission to the end)."""
    snaps = res["snapshots"]
    start = next(c for k, _, c in snaps if k == 0)
    return snaps[-1][2][m][key] - start[m][key]


def _wait_listen(hosts, proc, log, timeout=90.0):
    probe = f"import socket,sys; s=socket.socket(); s.settimeout(1); sys.exit(s.connect_ex(('{LINK_IP}', {PORT})))"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}; see {log}")
        if subprocess.run(hosts.exec_cmd(hosts.central, [sys.executable, "-c", probe])).returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"flower-superlink did not listen on {LINK_IP}:{PORT} in {timeout:g} s; see {log}")


def _wait_nodes(logs, n, procs, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = [(logs / f"node{m}.log").read_text(errors="replace") if (logs / f"node{m}.log").is_file() else ""
                 for m in range(n)]
        if all("SuperNode ID" in t or "Node ID" in t for t in texts):
            return
        for m in range(n):
            p = procs.procs.get(f"node{m}")
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"party {m}'s SuperNode exited with {p.returncode}: {texts[m][-1500:]}")
        time.sleep(0.5)
    raise RuntimeError(f"the SuperNodes did not connect within {timeout:g} s; see {logs}")


def per_round(snaps, first=2) -> dict:
    """Median seconds and link bytes (both directions, all parties) per round, from the
    snapshots taken when report.json gained a round; rounds before ``first`` excluded."""
    import statistics
    rows = [(k, t, sum(c["rx_bytes"] + c["tx_bytes"] for c in cs.values()),
             sum(c["rx_packets"] + c["tx_packets"] for c in cs.values())) for k, t, cs in snaps if isinstance(k, int)]
    rows = [r for r in rows if r[0] >= first - 1]
    d = [(b[1] - a[1], b[2] - a[2], b[3] - a[3]) for a, b in zip(rows, rows[1:]) if b[0] == a[0] + 1]
    if not d:
        return {}
    return {"rounds_measured": len(d), "s_per_round": statistics.median(x[0] for x in d),
            "bytes_per_round": statistics.median(x[1] for x in d), "packets_per_round": statistics.median(x[2] for x in d)}


# ----------------------------------------------------------------------------- WAN relay

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def _open_tun(ns: str, dev: str) -> int:
    """A TUN device named ``dev`` created inside namespace ``ns`` (it lives while the fd is
    open); the calling thread returns to its own namespace."""
    import ctypes
    import fcntl
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", dev.encode(), IFF_TUN | IFF_NO_PI))
    finally:
        if libc.setns(home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back")
        os.close(home)
        os.close(target)
    return fd


def relay_main(argv=None) -> int:
    """``python tests/_netns.py --delay-ms D --loss P CENTRAL:DEV:PARTY:DEV ...``: make the TUN
    devices, print ``ready``, then copy every IP packet from one end of a link to the other
    after ``D`` ms, dropping each with probability ``P`` (independently, both directions), until
    SIGTERM or the end of its standard input. A line ``{"delay_ms": D, "loss": P}`` on standard
    input changes the setting for packets read from then on; the relay answers with the counts
    of the setting just ended on standard output. The last setting's counts go to stderr at
    the end."""
    import argparse
    import selectors
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=-1)
    ap.add_argument("pairs", nargs="+")
    a = ap.parse_args(argv)
    rng = random.Random(None if a.seed < 0 else a.seed)
    peer = {}
    for spec in a.pairs:
        cns, cdev, pns, pdev = spec.split(":")
        c, p = _open_tun(cns, cdev), _open_tun(pns, pdev)
        peer[c], peer[p] = p, c
    sel = selectors.DefaultSelector()
    for fd in peer:
        sel.register(fd, selectors.EVENT_READ)
    control = sys.stdin.fileno()      # one JSON line per new setting; end of input stops the relay
    sel.register(control, selectors.EVENT_READ)
    pending = b""
    delay, loss, queue, seq = a.delay_ms / 1000.0, a.loss, [], 0
    stats = {"forwarded": 0, "dropped": 0, "write_failed": 0, "bytes": 0}
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while running[0]:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, pkt = heapq.heappop(queue)
            try:
                os.write(out, pkt)
                stats["forwarded"] += 1
                stats["bytes"] += len(pkt)
            except OSError:            # device down or its queue full: lost, as on a wire
                stats["write_failed"] += 1
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 0.5
        try:
            events = sel.select(timeout)
        except InterruptedError:
            continue
        for key, _ in events:
            if key.fd == control:
                chunk = os.read(control, 4096)
                if not chunk:
                    running[0] = False
                    break
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    setting = json.loads(line)
                    delay, loss = float(setting["delay_ms"]) / 1000.0, float(setting["loss"])
                    sys.stdout.write(json.dumps(stats) + "\n")     # the finished period's counts
                    sys.stdout.flush()
                    stats = {"forwarded": 0, "dropped": 0, "write_failed": 0, "bytes": 0}
                continue
            while True:
                try:
                    pkt = os.read(key.fd, 65535)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if loss and rng.random() < loss:
                    stats["dropped"] += 1
                    continue
                seq += 1
                heapq.heappush(queue, (time.monotonic() + delay, seq, peer[key.fd], pkt))
    sys.stderr.write(json.dumps(stats) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(relay_main())
