"""flower-vfl-supernode names a TLS mismatch with its SuperLink (issue 23): a node started with
``--insecure`` against a SuperLink serving TLS (Flower: "Connection attempt failed" forever) logs
one line saying to use ``--root-certificates`` and exits after 3 failed attempts; a node with TLS
against a plain SuperLink is told to use ``--insecure`` (Flower exits there anyway). The probe is
checked against a TLS and a plain server started here; one slow test runs a real TLS SuperLink."""

import shutil
import socket
import ssl
import sys
import threading
import time

import pytest

from flower_vfl.deploy import supernode
from flower_vfl.deploy.local import Processes, any_alive, free_port, loopback_env, make_pki

TLS_LINE = ("flower-vfl-supernode: the SuperLink at 127.0.0.1:{port} speaks TLS but this node runs with --insecure; "
            "start it with --root-certificates <the CA file> instead of --insecure")
PLAIN_LINE = ("flower-vfl-supernode: the SuperLink at 127.0.0.1:{port} does not speak TLS but this node connects "
              "with TLS; start it with --insecure, or start the SuperLink with --ssl-ca-certfile, --ssl-certfile "
              "and --ssl-keyfile")


class _Server:
    """A loopback server in a thread: ``tls`` (a TLS handshake, then whatever comes), ``plain``
    (answers any bytes with an HTTP 400, as uvicorn does to a TLS hello) or ``mute`` (closes at
    once). Serves every connection until closed."""

    def __init__(self, kind, pki=None):
        self.kind, self.sock, self.stop = kind, socket.create_server(("127.0.0.1", 0)), threading.Event()
        self.sock.settimeout(0.1)              # a closed socket does not wake accept(): look at stop
        self.port = self.sock.getsockname()[1]
        if kind == "tls":
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ctx.load_cert_chain(pki["cert"], pki["key"])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    if self.kind == "tls":
                        with self.ctx.wrap_socket(conn, server_side=True) as tls:
                            tls.recv(1024)
                    elif self.kind == "plain":
                        conn.recv(1024)
                        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:                 # ssl.SSLError: plain text to the TLS server
                    pass

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def servers(tmp_path):
    pki = make_pki(tmp_path / "pki", 0)
    made = {k: _Server(k, pki) for k in ("tls", "plain", "mute")}
    yield made
    for s in made.values():
        s.close()


def test_probe_tells_tls_from_plain(servers):
    assert supernode.probe_tls("127.0.0.1", servers["tls"].port) is True
    assert supernode.probe_tls("127.0.0.1", servers["plain"].port) is False
    assert supernode.probe_tls("127.0.0.1", servers["mute"].port) is None        # closed without a word
    assert supernode.probe_tls("127.0.0.1", free_port(), timeout=1) is None     # nothing listens


def test_hint_text():
    assert supernode.mismatch_hint("127.0.0.1:9092", True, True) == TLS_LINE.format(port=9092)
    assert supernode.mismatch_hint("127.0.0.1:9092", False, False) == PLAIN_LINE.format(port=9092)
    assert supernode.mismatch_hint("127.0.0.1:9092", True, False) is None       # both plain: another cause
    assert supernode.mismatch_hint("127.0.0.1:9092", False, True) is None
    assert supernode.mismatch_hint("127.0.0.1:9092", True, None) is None


@pytest.fixture
def flower_invoker(monkeypatch):
    """Flower's retry invoker for the node's connection, as fleet_http_connection makes it once
    patched, without its waits."""
    import flwr.supernode.fleet_http_connection as conn

    monkeypatch.setattr(conn, "make_simple_http_retry_invoker", conn.make_simple_http_retry_invoker)
    assert supernode.hint_tls_mismatch() is True
    assert supernode.hint_tls_mismatch() is True                # wraps Flower's once

    def make():
        invoker = conn.make_simple_http_retry_invoker()
        invoker.wait_function = lambda seconds: None
        return invoker
    return make


def _hints(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("flower-vfl-supernode:")]


def test_insecure_node_against_tls_is_told_and_gives_up(servers, flower_invoker, caplog):
    import httpx

    port, calls = servers["tls"].port, []

    def post(url):
        calls.append(url)
        with httpx.Client(timeout=5) as client:
            return client.post(url)

    with caplog.at_level("WARNING"), pytest.raises(supernode.TLSMismatchError) as info:
        flower_invoker().invoke(post, f"http://127.0.0.1:{port}/v1/fleet/register-node")
    assert len(calls) == supernode.MISMATCH_EXIT_AFTER == 3
    assert _hints(caplog) == [TLS_LINE.format(port=port)]
    assert str(info.value) == TLS_LINE.format(port=port) + " (gave up after 3 failed attempts)"


def test_tls_node_against_plain_is_told(servers, flower_invoker, caplog):
    import httpx

    port = servers["plain"].port
    with caplog.at_level("WARNING"), pytest.raises(httpx.ConnectError, match="WRONG_VERSION_NUMBER|wrong version"):
        flower_invoker().invoke(httpx.Client(verify=False, timeout=5).post, f"https://127.0.0.1:{port}/x")
    assert _hints(caplog) == [PLAIN_LINE.format(port=port)]               # then Flower's own exit (305)


def test_no_hint_and_no_exit_when_it_is_not_tls(servers, flower_invoker, caplog):
    """An insecure node whose SuperLink closes connections without a word, or that connected
    before: Flower's retries, untouched (up to max_tries here)."""
    import httpx

    invoker = flower_invoker()
    invoker.max_tries = 6
    with caplog.at_level("WARNING"), pytest.raises(httpx.TransportError):
        invoker.invoke(httpx.Client(timeout=5).post, f"http://127.0.0.1:{servers['mute'].port}/x")
    assert _hints(caplog) == []
    from flwr.supercore.retry import make_simple_http_retry_invoker

    probed = []
    invoker = supernode._TLSDiagnosis(probe=lambda host, port: probed.append(port) or True).attach(
        make_simple_http_retry_invoker())
    invoker.max_tries, invoker.wait_function = 6, lambda seconds: None
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert invoker.invoke(lambda: "node 7") == "node 7"                # connected once
        with pytest.raises(httpx.TransportError):
            invoker.invoke(httpx.Client(timeout=5).post, f"http://127.0.0.1:{servers['tls'].port}/x")
    assert probed == [servers["tls"].port]                                 # probed once
    assert _hints(caplog) == [TLS_LINE.format(port=servers["tls"].port)]   # told once, retried to the end


def test_other_flower_release_is_left_alone(monkeypatch):
    import flwr
    import flwr.supernode.fleet_http_connection as conn

    flower = conn.make_simple_http_retry_invoker
    monkeypatch.setattr(flwr, "__version__", "1.99.0")
    with pytest.warns(UserWarning, match=r"^flower-vfl: Flower patch 'tls-mismatch-hint' not applied \(flwr 1\.99\.0 "
                                         r"is not one of 1\.41\.x, 1\.42\.x\); a --insecure/TLS mismatch"):
        assert supernode.hint_tls_mismatch() is False
    assert conn.make_simple_http_retry_invoker is flower


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")
def test_insecure_supernode_against_tls_superlink_exits_with_the_hint(tmp_path):
    """A real TLS SuperLink and flower-vfl-supernode --insecure: the hint once, then Flower's exit
    305 with the same line (process exit 1) within seconds, not retries forever; nothing left."""
    pki = make_pki(tmp_path / "pki", 0)
    link = free_port()
    env = loopback_env(tmp_path / "flwr_home")
    with Processes(tmp_path / "logs") as procs:
        superlink = procs.start("superlink", ["flower-superlink", "--port", link, "--ssl-ca-certfile", pki["ca"],
                                              "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"],
                                              "--disable-runtime-dependency-installation"], env, tmp_path)
        deadline = time.monotonic() + 30
        while supernode.probe_tls("127.0.0.1", link, timeout=1) is not True:
            assert superlink.poll() is None and time.monotonic() < deadline, "the SuperLink did not start"
            time.sleep(0.3)
        node = procs.start("node", [sys.executable, "-m", "flower_vfl.deploy.supernode", "--insecure",
                                    "--superlink", f"127.0.0.1:{link}", "--port", free_port()], env, tmp_path)
        code = node.wait(timeout=60)
        started = list(procs.started)
    log = (tmp_path / "logs" / "node.log").read_text(errors="replace")
    line = TLS_LINE.format(port=link)
    assert code == 1                                # Flower's exit 305, SUPERNODE_CONNECTION_ERROR
    assert log.count(line) == 2, log                # the hint, and the exit message
    assert f"{line} (gave up after 3 failed attempts)" in log and "ref-exit-codes/305" in log
    assert any_alive(started) == []
