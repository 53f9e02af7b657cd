"""Real Flower processes on loopback: a SuperLink and one SuperNode per party, with TLS (a
generated self-signed CA) and registered SuperNode keys bound to parties; submit a job, read
its status from Flower (``flwr ls --format json``: ``flwr run --stream`` exits 0 even when the
ServerApp failed), collect the report, and stop every process started here by its process group.

    flower-vfl deploy-local --num-parties 2 --dataset a9a --max-rounds 3 --out-dir runs/deploy

``flower-vfl simulate`` runs Flower's simulation engine on a SuperLink of its own
(:func:`simulation_superlink`: a free port, its own FLWR_HOME, runtime dependency installation
off), never on the shared local SuperLink ``flwr run`` starts on fixed ports. Every SuperLink
started here is recorded in a per-user registry (:func:`superlink_registry`) while it runs, so
``flower-vfl superlink list`` / ``stop`` find it by its recorded PID and process group.

Why not Flower's own local SuperLink (Flower 1.41/1.42, ``flwr/simulation/app.py``): it
installs the app's dependencies for each run (``uv sync`` into
``$FLWR_HOME/runtime-envs/<run>``, ~100 packages, ~600 MB for this app) and registers the
deletion of that folder as an exit handler *after* the handler that reports the run's status.
Exit handlers run last-registered-first under a 5 s force-exit timer
(``FORCE_EXIT_TIMEOUT_SECONDS``), so the status is pushed only after the folder is deleted;
under load the deletion takes longer (10 s measured at load 17), the process is killed first,
the SuperLink never hears the run's end and marks it ``finished:failed`` "No heartbeat
received from the task" 60 s after the last heartbeat (``HEARTBEAT_PATIENCE`` x 30 s),
whether the run completed or failed with a real error.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Processes", "any_alive", "free_port", "make_pki", "write_connection", "submit", "run_status", "wait_run",
           "exit_code", "run_error", "failure_message", "ray_did_not_start", "managed_superlink_pids", "simulation_superlink",
           "party_is_private", "loopback_env", "idle_poll_for", "start_supernode", "start_server_exec", "Zygote", "ZygoteError", "superlink_registry", "recorded_superlinks", "stop_recorded_superlink", "deploy_local", "RoundProgress"]

FINISHED = "finished:"
#: seconds between the SuperExec's task polls on the loopback SuperNodes (Flower's default: 1.0)
SUPEREXEC_POLL_S = "0.2"
#: while a run's log stream is open, :func:`wait_run` asks Flower for its status this often (s)
STATUS_EVERY_S = 30.0
ISOLATIONS = ("subprocess", "warm")


class Processes:
    """Processes started here, each in its own session; :meth:`stop_all` signals each one's
    process group (the SuperNode's ClientApp children, the SuperLink's ServerApp) and nothing
    else. A context manager: leaving the block stops everything."""

    def __init__(self, log_dir):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.adopted: list[int] = []
        self.started: list[int] = []      # every process group ever started here

    def start(self, name, cmd, env=None, cwd=None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        self.started.append(proc.pid)
        return proc

    def adopt(self, pid: int) -> None:
        """A process this code caused to start elsewhere (Flower's managed local SuperLink)."""
        self.adopted.append(int(pid))

    def stop(self, name, sig=signal.SIGTERM, timeout=20.0) -> None:
        proc = self.procs.pop(name)
        _stop_group(proc.pid, sig, timeout, proc)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        for pid in self.adopted:
            _stop_group(pid, signal.SIGTERM, 20.0)
        self.adopted = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()


def _alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _stop_group(pid, sig, timeout, proc=None) -> None:
    """SIGTERM the process group led by ``pid`` (the session started for it), then SIGKILL."""
    for s in (sig, signal.SIGKILL):
        try:
            os.killpg(pid, s)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None and not _group_alive(pid):
                return
            if proc is None and not _alive(pid) and not _group_alive(pid):
                return
            time.sleep(0.2)


def any_alive(pids) -> list[int]:
    """The process groups among ``pids`` that still have a live process."""
    return [p for p in pids if _group_alive(p)]


def _group_alive(pgid) -> bool:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def managed_superlink_pids(flwr_home) -> list[int]:
    """PIDs of the local SuperLink that ``flwr run`` started detached for ``flwr_home`` (its log
    file lives under that FLWR_HOME, so no other user's SuperLink matches)."""
    marker = str(Path(flwr_home) / "local-superlink")
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(b"flower-superlink" in c for c in cmd[:2]) and any(marker.encode() in c for c in cmd):
                pids.append(int(d.name))
    return pids


def superlink_registry() -> Path:
    """The per-user folder where every SuperLink this package starts is recorded while it runs
    (``$FLOWER_VFL_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/flower-vfl``, else
    ``~/.cache/flower-vfl/superlinks``)."""
    env = os.environ.get("FLOWER_VFL_RUNTIME_DIR")
    if env:
        base = Path(env)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        base = Path(os.environ["XDG_RUNTIME_DIR"]) / "flower-vfl"
    else:
        base = Path.home() / ".cache" / "flower-vfl" / "superlinks"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _proc_start(pid) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): with
    the PID it names one process, never a later one that reuses the PID."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def record_superlink(proc, port, flwr_home, command, log=None) -> Path:
    """Record a SuperLink started here (its PID = its process group, its port, FLWR_HOME, the
    command that started it) in :func:`superlink_registry`; returns the record's path."""
    rec = {"pid": proc.pid, "pgid": proc.pid, "start": _proc_start(proc.pid), "port": int(port),
           "flwr_home": str(flwr_home), "command": command, "log": str(log) if log else None,
           "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
           "owner_pid": os.getpid()}
    path = superlink_registry() / f"superlink-{proc.pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)
    return path


def recorded_superlinks(prune: bool = True) -> list[dict]:
    """The SuperLinks recorded in :func:`superlink_registry` that still run (same PID and the
    same start time); records of stopped ones are removed (``prune``)."""
    out = []
    for path in sorted(superlink_registry().glob("superlink-*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("start") and _proc_start(rec["pid"]) == rec["start"] and _alive(rec["pid"]):
            out.append(dict(rec, record=str(path)))
        elif prune:
            path.unlink(missing_ok=True)
    return out


def stop_recorded_superlink(pid: int, timeout: float = 20.0) -> dict:
    """Stop one recorded SuperLink by its recorded process group (SIGTERM, then SIGKILL); only
    a PID the registry holds, with its recorded start time. Returns its record; raises
    ``LookupError`` when no running SuperLink is recorded under ``pid``."""
    for rec in recorded_superlinks():
        if int(rec["pid"]) == int(pid):
            _stop_group(int(rec["pgid"]), signal.SIGTERM, timeout)
            Path(rec["record"]).unlink(missing_ok=True)
            return rec
    raise LookupError(pid)


def _wait_http_health(port, proc, log, timeout=60.0):
    """Until the SuperLink answers ``GET /health`` on ``port`` (what ``flwr`` itself probes)."""
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as res:
                if res.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"flower-superlink did not answer on port {port} within {timeout:g} s; see {log}")


class simulation_superlink:
    """A SuperLink of its own for one ``flower-vfl simulate`` job, as a context manager.

    ``flwr run`` on a ``:local:`` connection shares one detached SuperLink per machine on fixed
    ports (39091/39093), started with the environment and settings of whichever run came first,
    and (unless that run set ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``) installs the
    app's dependencies for each run, which loses the run's status under load (module doc).
    Here: ``flower-superlink --simulation`` on a free loopback port, its own FLWR_HOME under
    ``workdir``, runtime dependency installation off by flag, the environment this job sets
    (``env_extra``), recorded in :func:`superlink_registry`, and stopped by its process group
    when the block ends. ``self.connection`` and ``self.env`` are for ``flwr``."""

    def __init__(self, workdir, env_extra=None, command="simulate"):
        self.workdir = Path(workdir)
        self.env_extra, self.command = dict(env_extra or {}), command
        self.procs = Processes(self.workdir / "logs")
        self.record = None

    def __enter__(self):
        home = self.workdir / "flwr_home"
        self.port = free_port()
        self.env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        **self.env_extra)
        self.env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), self.env.get("PATH", "")])
        self.connection = write_connection(home, "flower-vfl-simulation", f"127.0.0.1:{self.port}")
        cmd = ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess", "--host", "127.0.0.1",
               "--port", self.port, "--disable-runtime-dependency-installation"]
        #: a `flwr` for the job's `flwr run` (:func:`submit`'s ``warm``), importing Flower's CLI
        #: while the SuperLink starts; closed at the end if unused
        self.warm_flwr = WarmFlwr.start(self.env)
        try:
            proc = self.procs.start("superlink", cmd, self.env, self.workdir)
            self.record = record_superlink(proc, self.port, home, self.command, self.procs.log_dir / "superlink.log")
            _wait_http_health(self.port, proc, self.procs.log_dir / "superlink.log")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if getattr(self, "warm_flwr", None) is not None:
            self.warm_flwr.close()
        self.procs.stop_all()
        if self.record is not None:
            Path(self.record).unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_pki(folder, n_nodes: int) -> dict:
    """A self-signed CA, a SuperLink certificate for 127.0.0.1/localhost, and one EC (P-384)
    authentication key pair per SuperNode (OpenSSH format, as Flower reads them). Returns the
    paths and each node key's SHA-256 fingerprint as the SuperLink reports it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def pem_key(key, path):
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    def cert(subject, issuer, pub, sign_key, ca, sans=None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(sign_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flower-vfl loopback CA")])
    ca_cert = cert(ca_name, ca_name, ca_key.public_key(), ca_key, True)
    srv_key = ec.generate_private_key(ec.SECP384R1())
    srv_cert = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name,
                    srv_key.public_key(), ca_key, False,
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    out = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key", "nodes": []}
    out["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    out["cert"].write_bytes(srv_cert.public_bytes(serialization.Encoding.PEM))
    pem_key(srv_key, out["key"])
    for i in range(n_nodes):
        k = ec.generate_private_key(ec.SECP384R1())
        priv, pub = folder / f"node{i}", folder / f"node{i}.pub"
        priv.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                         serialization.NoEncryption()))
        priv.chmod(0o600)
        pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                    serialization.PublicFormat.OpenSSH))
        spki = k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        out["nodes"].append({"private": priv, "public": pub, "fingerprint": hashlib.sha256(spki).hexdigest()})
    return out


def write_connection(flwr_home, name, address, root_certificates=None) -> str:
    """``$FLWR_HOME/config.toml`` with one SuperLink connection (TLS when a CA is given)."""
    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    tls = f'root-certificates = "{root_certificates}"\n' if root_certificates else "insecure = true\n"
    (home / "config.toml").write_text(f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\n'
                                      f'address = "{address}"\n{tls}')
    return name


def _flwr_json(args, env, timeout=120) -> dict:
    proc = subprocess.run(["flwr", *args, "--format", "json"], env=env, capture_output=True, text=True,
                          timeout=timeout)
    try:
        return json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        raise RuntimeError(f"`flwr {' '.join(args)}` gave no JSON (exit {proc.returncode}): "
                           f"{(proc.stdout + proc.stderr)[-2000:]}") from None


def submit(app_dir, connection, run_config: str, env, federation_config=None, warm=None) -> str:
    """``flwr run`` (not streamed); returns the run id or raises with Flower's message. ``warm``: a
    :class:`WarmFlwr` started with ``env`` earlier (e.g. while the SuperLink started); a fresh
    ``flwr`` runs the command only if the warm process died before it was given the command (a
    command given may have submitted the run: it is never given twice)."""
    args = ["run", str(app_dir), *([connection] if connection else []), "--run-config", run_config]
    if federation_config:
        args += ["--federation-config", federation_config]
    if warm is not None and warm.alive():
        res = warm.json(args, timeout=300)
    else:
        res = _flwr_json(args, env, timeout=300)
    if not res.get("success"):
        raise RuntimeError(f"flwr run failed: {res.get('error-message', res)}")
    return str(res["run-id"])


#: a ``flwr`` command run by a process that imported Flower's CLI ahead of time (:class:`WarmFlwr`):
#: it reads its arguments (a JSON list) from stdin, then runs them through the ``flwr`` entry point
_WARM_FLWR = """
import json, sys
from flwr.cli.app import app
line = sys.stdin.readline()
if not line:
    sys.exit(0)
sys.argv = ["flwr", *json.loads(line)]
app()
"""


class WarmFlwr:
    """One ``flwr`` command whose process is started (and has imported Flower's CLI: ~1-4 s of a
    ``flwr ls``, with the machine's load) before the command is known. :func:`wait_run` starts one
    while the run runs and reads the finished run's status through it, so the status is read as
    soon as the log stream ends instead of a CLI start later. Flower's own CLI code runs the
    command (``flwr.cli.app:app``, the ``flwr`` entry point, in this interpreter); if the process
    is gone or gives no JSON, the caller falls back to a fresh ``flwr`` (:func:`_flwr_json`)."""

    @classmethod
    def start(cls, env) -> "WarmFlwr | None":
        """A warm ``flwr`` when the ``flwr`` that ``env``'s PATH finds is the entry-point script of
        this interpreter's Flower (else None: e.g. a wrapper on PATH, which a fresh ``flwr`` runs)."""
        import shutil
        exe = shutil.which("flwr", path=(env or {}).get("PATH", ""))
        if not exe:
            return None
        try:
            with open(exe, "rb") as fh:
                head = fh.read(4096).decode("utf-8", "replace")
        except OSError:
            return None
        first = head.splitlines()[0] if head else ""
        if not first.startswith("#!") or "from flwr.cli.app import app" not in head:
            return None
        interp = first[2:].strip().split()[0] if first[2:].strip() else ""
        try:
            if not interp or os.path.realpath(interp) != os.path.realpath(sys.executable):
                return None
        except OSError:
            return None
        try:
            return cls(env)
        except OSError:
            return None

    def __init__(self, env):
        self.proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", _WARM_FLWR], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)

    def alive(self) -> bool:
        """Not yet given a command, and its process is running (its import did not fail)."""
        return self.proc.poll() is None and not self.proc.stdin.closed

    def json(self, args, timeout=120) -> dict:
        """``flwr <args> --format json``'s answer, by the warm process (used once)."""
        out, err = self.proc.communicate(json.dumps([*map(str, args), "--format", "json"]) + "\n", timeout=timeout)
        try:
            return json.loads(out[out.index("{"):])
        except ValueError:
            raise RuntimeError(f"warm `flwr {' '.join(map(str, args))}` gave no JSON (exit {self.proc.returncode}): "
                               f"{(out + err)[-2000:]}") from None

    def close(self):
        """Stop it if it was never given a command (it runs nothing else: no child to wait for)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def run_status(run_id, connection, env, warm: WarmFlwr | None = None) -> dict:
    """The run's record from ``flwr ls --run-id --format json`` (keys status, status-details...);
    by ``warm`` (its one command) when given, else by a fresh ``flwr`` process."""
    args = ["ls", *([connection] if connection else []), "--run-id", str(run_id)]
    res = None
    if warm is not None:
        try:
            res = warm.json(args)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError):
            res = None                                   # a fresh `flwr ls` answers instead
    if res is None:
        res = _flwr_json(args, env)
    runs = res.get("runs") or []
    if not res.get("success") or not runs:
        raise RuntimeError(f"flwr ls found no run {run_id}: {res}")
    return runs[0]


_ANSI = __import__("re").compile(r"\x1b\[[0-9;]*m")


def wait_run(run_id, connection, env, log_path=None, timeout=3600.0, poll=2.0, echo=None, on_line=None) -> dict:
    """Stream the run's log until Flower says it finished; returns the final record, with the
    log's lines (ANSI colours removed) under ``"log_lines"`` and its file under ``"log_path"``.
    ``exit_code(record)`` is the honest status; :func:`failure_message` the real error.

    Each line goes to ``log_path`` (appended) and to ``echo`` (a text stream; default: stdout
    when there is no ``log_path``), and ``on_line(line)`` is called with it (progress)."""
    import threading
    if echo is None and log_path is None:
        echo = sys.stdout
    out = open(log_path, "a", encoding="utf-8", errors="replace") if log_path else None
    lines: list[str] = []
    streamer = subprocess.Popen(["flwr", "log", str(run_id), *([connection] if connection else []), "--stream"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                text=True, errors="replace")

    def pump():
        for raw in streamer.stdout:
            line = _ANSI.sub("", raw.rstrip("\n"))
            lines.append(line)
            if out:
                out.write(line + "\n")
                out.flush()
            if echo is not None:
                echo.write(raw if raw.endswith("\n") else raw + "\n")
                echo.flush()
            if on_line is not None:
                try:
                    on_line(line)
                except Exception:       # a progress display never stops the run's bookkeeping
                    pass
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        # the log stream ends with the run: Flower is asked for the status (a `flwr ls` process,
        # ~1 s of CPU) when it ends, and meanwhile only every STATUS_EVERY_S (`poll` s once the
        # stream is gone: it may also end early, e.g. with a lost connection)
        stream_end = None
        # a `flwr` process that imports Flower's CLI while the run runs: the status read when the
        # stream ends is then not a CLI start (1-4 s) later; each poll after it starts the next
        warm = WarmFlwr.start(env)
        while True:
            if streamer.poll() is None:
                try:
                    streamer.wait(timeout=max(0.0, min(STATUS_EVERY_S, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
            if stream_end is None and streamer.poll() is not None:
                stream_end = time.monotonic()
            rec = run_status(run_id, connection, env, warm)
            warm = WarmFlwr.start(env) if not str(rec.get("status", "")).startswith(FINISHED) else None
            if str(rec.get("status", "")).startswith(FINISHED) or time.monotonic() > deadline:
                break
            if streamer.poll() is not None:
                time.sleep(poll)
        try:
            streamer.wait(timeout=10)       # the stream ends with the run; let it flush
        except subprocess.TimeoutExpired:
            pass
        return rec
    finally:
        if locals().get("warm") is not None:
            warm.close()
        if streamer.poll() is None:
            _stop_group(streamer.pid, signal.SIGTERM, 5.0, streamer)
        reader.join(timeout=5)
        if out:
            out.close()
        if "rec" in locals():
            rec["log_lines"] = lines
            rec["log_path"] = str(log_path) if log_path else None
            rec["stream_ended_at"] = locals().get("stream_end")    # time.monotonic(), or None


class RoundProgress:
    """The run's rounds as they happen, from the ServerApp's log lines (``round k: train_loss=...``,
    ``final (round k): ...``: :func:`flower_vfl.apps.server.log_round`): a tqdm bar on ``file``
    (default stderr) up to ``total`` rounds (``max-rounds``; a run that converges earlier ends
    the bar at its last round), shown from the first round on (a run that fails before has none).
    Pass it as :func:`wait_run`'s ``on_line``; as its ``echo`` too, the log's lines are printed
    on ``echo`` above the bar (``tqdm.write``) instead of through it."""

    _ROUND = __import__("re").compile(r"\bround (\d+): train_loss=([-+0-9.eEnaif]+), primal_residual=([-+0-9.eEnaif]+)")
    _FINAL = __import__("re").compile(r"\bfinal \(round (\d+)\)")

    def __init__(self, total: int, file=None, echo=None):
        self.total, self.echo = int(total), echo
        self.file = sys.stderr if file is None else file
        self.bar = None
        self.rounds, self._last = 0, None      # the last round's number and when its line came

    def _open(self):
        from tqdm import tqdm
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc="rounds", unit="round", file=self.file, dynamic_ncols=True,
                            mininterval=0.0, bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}{postfix}")
        return self.bar

    def __call__(self, line: str) -> None:
        m = self._ROUND.search(line)
        if m:
            bar, k, now = self._open(), int(m.group(1)), time.monotonic()
            if k > bar.total:
                bar.total = k
            per = "" if self._last is None or k <= self.rounds else f", {(now - self._last) / (k - self.rounds):.1f} s/round"
            self.rounds, self._last = k, now
            bar.set_postfix_str(f"train_loss={float(m.group(2)):.4g}, primal={float(m.group(3)):.3g}{per}",
                                refresh=False)
            bar.update(k - bar.n)
            return
        m = self._FINAL.search(line)
        if m and self.bar is not None:
            self.bar.total = int(m.group(1))
            self.bar.update(self.bar.total - self.bar.n)
            self.close()

    def write(self, text: str) -> None:
        """A text stream for :func:`wait_run`'s ``echo``: each line above the bar."""
        from tqdm import tqdm
        text = text.rstrip("\n")
        if text and self.echo is not None:
            tqdm.write(text, file=self.echo)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


#: a traceback's closing line, ``Name: message`` (``flwr log`` prints them unindented)
_EXC_LINE = __import__("re").compile(r"^([A-Za-z_][\w.]*): (\S.*)$")
#: a one-line error of flower_vfl.errors on a Flower log line (apps' CleanUserErrors filter)
_RAISED = __import__("re").compile(r"raised an exception: (\S.*)$")


def run_error(lines) -> list[str]:
    """The errors a run's log names, in order, without repeats: the closing line of each
    traceback (``RuntimeError: ...``; the first is usually the root cause, since Python prints
    a chain cause-first) and the one-line ``... raised an exception: <Type>: <message>``
    records. Empty when the log names none."""
    found, prev = [], ""
    for line in lines:
        text = line.rstrip()
        m = _RAISED.search(text)
        if m and ":" in m.group(1):
            found.append(m.group(1))
        elif _EXC_LINE.match(text) and (prev.startswith("    ") or prev.startswith("  File ")) \
                and not text.startswith(("Traceback", "During handling")):
            found.append(text)
        if text.strip():
            prev = text
    return list(dict.fromkeys(found))


NO_HEARTBEAT = "No heartbeat received from the task"
#: Ray's error when its node does not register within its fixed 30 s (``ray/_private/node.py``)
RAY_NODE_TIMEOUT = "The current node timed out during startup"


def ray_did_not_start(record: dict) -> bool:
    """Whether the run failed because Ray's node did not start (a loaded machine), before any
    ClientApp ran: no round took place, nothing was released, the job may be run again."""
    lines = record.get("log_lines", [])
    return any(RAY_NODE_TIMEOUT in e for e in run_error(lines)) and not any(
        "round 1:" in ln or " -> node " in ln for ln in lines)


def failure_message(record: dict, lines=None) -> str:
    """What went wrong with a run that did not complete: the error its log names (the root
    cause first, then the last one when they differ), Flower's status and details, and what a
    lost heartbeat means; the log file when there is one."""
    lines = record.get("log_lines", []) if lines is None else lines
    errors = run_error(lines)
    status, details = record.get("status"), record.get("status-details", "N/A")
    parts = [f"run {record.get('run-id', '?')} {status}"]
    if errors:
        parts.append(f"error: {errors[0]}")
        if len(errors) > 1 and errors[-1] != errors[0]:
            parts.append(f"then: {errors[-1]}")
    if details and details != "N/A":
        parts.append(f"Flower's status details: {details}")
    if details and NO_HEARTBEAT in str(details):
        parts.append("(the process running the ServerApp ended, or was killed, without reporting to the "
                     "SuperLink; Flower marks such a run failed 60 s after its last heartbeat. "
                     + ("The error above is what its log shows" if errors else "Its log names no error")
                     + ")")
    elif not errors and lines:
        tail = [ln for ln in lines if ln.strip()][-5:]
        parts.append("the log's last lines:\n    " + "\n    ".join(tail))
    if record.get("log_path"):
        parts.append(f"full log: {record['log_path']}")
    return "\n  ".join(parts)


def exit_code(record: dict) -> int:
    """0 when Flower says the run completed, 1 otherwise (failed, stopped, timed out)."""
    return 0 if record.get("status") == "finished:completed" else 1


def _node_config(items: dict) -> str:
    items = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in items.items()}
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v}"
                    .replace('"', "'") for k, v in items.items())


def party_is_private(party: int, run_config: dict, node_config: dict) -> bool:
    """Whether party ``party`` with this node config releases noisy values in a run of this run
    config (:func:`flower_vfl.config.settings.privacy_from_config`; a party asked to be private
    without a budget refuses to start, and counts as private here)."""
    from flower_vfl.config.settings import privacy_from_config
    try:
        return privacy_from_config(party, run_config, node_config) is not None
    except Exception:               # noqa: BLE001 - the party itself refuses, with the message
        return True


class ZygoteError(RuntimeError):
    """The warm process could not fork a requested process (the caller starts it separately)."""


class _Forked:
    """A forked process as :class:`~flower_vfl.deploy.local.Processes` sees a Popen: ``pid``,
    ``poll()``, ``wait()``, ``returncode`` (None while alive; 0 once gone: the warm process, its
    parent, reaps it and keeps no status)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None and not _alive(self.pid):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.1)
        return self.returncode


class Zygote:
    """The warm process, started by ``procs`` (under ``name``) with ``env`` in ``cwd``;
    :meth:`start` forks one SuperNode or executor and registers it in ``procs`` under its name."""

    def __init__(self, procs, env, cwd, name="zygote"):
        log = open(procs.log_dir / f"{name}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "flower_vfl.deploy.zygote"], env=env, cwd=cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                     start_new_session=True, text=True)
        log.close()
        procs.procs[name] = self.proc
        procs.started.append(self.proc.pid)
        self.procs, self.name = procs, name

    def start(self, name: str, kind: str, argv: list[str]):
        """Fork ``kind`` ('node': flower-vfl's SuperNode; 'exec': the warm executor) with ``argv``
        (its command line without the interpreter and module), logging to ``<log_dir>/<name>.log``."""
        req = {"kind": kind, "argv": [str(a) for a in argv], "log": str(self.procs.log_dir / f"{name}.log")}
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise ZygoteError(f"the warm process is gone ({exc}); see {self.procs.log_dir / self.name}.log") from None
        if not line:
            raise ZygoteError(f"the warm process exited (code {self.proc.poll()}); "
                              f"see {self.procs.log_dir / self.name}.log")
        ans = json.loads(line)
        if "pid" not in ans:
            raise ZygoteError(ans.get("error", "no pid"))
        child = _Forked(int(ans["pid"]))
        self.procs.procs[name] = child
        self.procs.started.append(child.pid)
        return child

def loopback_env(flwr_home) -> dict:
    """The environment of Flower processes started here: their own ``FLWR_HOME``, no runtime
    dependency installation, a 0.2 s SuperExec task poll and this interpreter's bin folder first."""
    env = dict(os.environ, FLWR_HOME=str(flwr_home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    # the SuperNode's flower-superexec (it inherits this environment) asks for a task every 1 s
    # by default: up to 1 s lost before each message's ClientApp starts (docs/benchmarks.md)
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", SUPEREXEC_POLL_S)
    # Flower's commands (and the flwr-clientapp each message starts) from this interpreter's
    # own bin folder first: a version-manager shim (pyenv) on PATH costs ~0.2 s per start
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env



def hot_poll_for(num_parties: int) -> float:
    """The ``--hot-poll`` of each of ``num_parties`` SuperNodes on one SuperLink: the SuperNode's
    default (0.02 s: the next round's message is picked up within ~20 ms of its push) for up to 2
    parties, stretched with M beyond (0.02 x M/2, at most 0.5 s), so that the pulls the SuperLink
    serves in the hot window stay at ~100 a second whatever M (16 parties at 0.02 s would be 800 a
    second, most of the SuperLink's CPU)."""
    from flower_vfl.deploy.supernode import HOT_POLL_RANGE, HOT_POLL_S
    return round(min(HOT_POLL_RANGE[1], HOT_POLL_S * max(1.0, num_parties / 2)), 4)

def idle_poll_for(num_parties: int, idle_poll: float = 0.5) -> float:
    """The ``--idle-poll`` of each of ``num_parties`` SuperNodes on one SuperLink: ``idle_poll``
    for up to 8 parties, stretched with M beyond (x M/8, at most 3 s, Flower's own), so that the
    idle nodes' pulls stay at ~16 a second whatever M. A node's hot window opens near when its
    next message came last time (:class:`flower_vfl.deploy.supernode._CappedTime`), so in regular
    rounds the message is picked up within the hot poll, not the idle one."""
    from flower_vfl.deploy.supernode import IDLE_POLL_RANGE
    return round(min(IDLE_POLL_RANGE[1], max(idle_poll, idle_poll * num_parties / 8)), 4)


def start_supernode(procs: Processes, name: str, superlink: str, node_config, env, cwd, *, exec_name=None,
                    root_certificates=None, auth_key=None, idle_poll=0.5, isolation="warm", accountants="auto",
                    heartbeat=None, hot_poll=None, node_main=None, zygote=None, wake=True):
    """One party's SuperNode as ``deploy-local`` runs it, started by ``procs`` under ``name``
    (and, with ``isolation='warm'``, its warm executor under ``exec_name``, default
    ``<name>-exec``: two process groups; stop both). ``node_config``: a dict (or the
    ``--node-config`` text); ``root_certificates`` None means ``--insecure``; ``auth_key``: the
    node's registered private key; ``idle_poll`` None starts Flower's ``flower-supernode`` as
    shipped; ``hot_poll``: ``flower-vfl-supernode --hot-poll`` (None: its default);
    ``heartbeat``: seconds between the node's heartbeats (``flower-vfl-supernode
    --heartbeat``; None: Flower's 30 s); ``node_main``: the interpreter arguments that run
    flower-vfl's SuperNode (default ``-m flower_vfl.deploy.supernode``); ``zygote``: a
    :class:`Zygote` that forks the SuperNode and its executor (the same
    arguments; separate interpreters if it cannot); ``wake`` (default True, with the warm isolation
    and flower-vfl's SuperNode): the node wakes its executor over a loopback UDP port when it
    stored a message (``--wake-executor`` / ``--wake-port``) instead of the executor polling for
    tasks every 10 ms (docs/benchmarks.md, "The floor of a round"). Returns the SuperNode's Popen
    (or the fork's stand-in)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r}; choose one of {ISOLATIONS}")
    port = free_port()
    nc = node_config if isinstance(node_config, str) else _node_config(node_config)
    cmd = ["flower-supernode"] if idle_poll is None else \
        [sys.executable, *(node_main or ["-m", "flower_vfl.deploy.supernode"]), "--idle-poll", str(idle_poll)]
    if hot_poll is not None:
        if idle_poll is None:
            raise ValueError("hot_poll needs flower-vfl's SuperNode (idle_poll not None): Flower's has no such flag")
        cmd += ["--hot-poll", str(hot_poll)]
    if heartbeat is not None:
        if idle_poll is None:
            raise ValueError("heartbeat needs flower-vfl's SuperNode (idle_poll not None): Flower's has no such flag")
        cmd += ["--heartbeat", str(heartbeat)]
    cmd += ["--superlink", superlink, "--port", port, "--node-config", nc]
    cmd += ["--root-certificates", str(root_certificates)] if root_certificates else ["--insecure"]
    if auth_key:
        cmd += ["--auth-supernode-private-key", str(auth_key)]
    if isolation == "warm":
        cmd += ["--isolation", "process"]
    # flower-vfl's ClientApp (the installed package: the app folder the package ships) imported at
    # the executor's start, so the first message (identify) is forked with it too
    ecmd = [sys.executable, "-m", "flower_vfl.deploy.warm_exec", "--insecure",
            "--runtime-api-address", f"127.0.0.1:{port}", "--accountants", accountants,
            "--preload-package", "flower_vfl.apps.client"]
    if isolation == "warm" and idle_poll is not None and wake:
        # the node wakes its executor when it stored a message: no task polling every 10 ms
        wport = free_udp_port()
        cmd += ["--wake-executor", str(wport)]
        ecmd += ["--wake-port", str(wport)]
    if zygote is not None and isolation == "warm" and idle_poll is not None and node_main is None:
        try:
            proc = zygote.start(name, "node", cmd[3:])
            zygote.start(exec_name or f"{name}-exec", "exec", ecmd[3:])
            return proc
        except ZygoteError as exc:
            import warnings
            warnings.warn(f"flower-vfl deploy-local: {name} not forked from the warm process ({exc}); started "
                          "as its own interpreter", stacklevel=2)
            if name in procs.procs:
                procs.stop(name)
    proc = procs.start(name, cmd, env, cwd)
    if isolation == "warm":      # the node's Runtime API is plain HTTP on loopback (its --port)
        procs.start(exec_name or f"{name}-exec", ecmd, env, cwd)
    return proc


def deploy_local(workdir, num_parties: int, run_config: dict, node_configs=None, app_dir=".", tls=True,
                 auth=True, bind_keys=True, timeout=1800.0, processes=None, node_keys=None,
                 isolation="warm", idle_poll=0.5, echo=None, on_line=None, fork_nodes=True,
                 warm_server=None) -> dict:
    """SuperLink + ``num_parties`` SuperNodes on loopback, one job, everything stopped after.

    ``node_configs[m]`` (extra node-config keys of party m; ``state-dir`` defaults to
    ``workdir/state/party<m>``); ``node_keys[m]`` (which generated
    key node m uses: tests swap them). Returns ``{"record", "exit_code", "run_id", "out_dir",
    "logs", "fingerprints"}``. With ``auth`` the SuperNode keys are registered with
    ``flwr supernode register`` and, with ``bind_keys``, a ``party-keys`` file binds party m to
    key m so that a node claiming another party is refused at identify.

    ``isolation``: ``'warm'`` (default: ``--isolation process``, each SuperNode served by
    :mod:`flower_vfl.deploy.warm_exec`, which forks each message's ClientApp process from an
    interpreter that has already imported flwr, numpy and scipy; ~2x faster rounds, see
    docs/benchmarks.md) or ``'subprocess'`` (Flower's default: the SuperNode's SuperExec starts
    a new ``flwr-clientapp`` interpreter per message). A warm executor imports the accountants'
    libraries (dp-accounting, opacus: torch) at start only for a party this node config and run
    config make private (:func:`party_is_private`; ``--accountants eager``); the others' executors
    (``auto``) import them only if one of their messages did.

    ``echo`` / ``on_line``: the run's log lines as they come (:func:`wait_run`; e.g. a
    :class:`RoundProgress`).

    ``fork_nodes`` (default True, with the warm isolation and flower-vfl's SuperNode): the
    SuperNodes and executors are forked from one process that imported their libraries once
    (:mod:`flower_vfl.deploy.zygote`: their pages shared, ~0.1-0.2 GB less per party); False: each
    its own interpreter.

    ``idle_poll``: seconds an idle SuperNode waits between pulls (default 0.5): the SuperNodes
    are started as ``flower-vfl-supernode --idle-poll`` (:mod:`flower_vfl.deploy.supernode`, Flower's
    ``flower-supernode`` with its hard-coded 3 s idle sleep capped), stretched beyond 8 parties
    (:func:`idle_poll_for`); ``None`` starts Flower's ``flower-supernode`` as shipped. Each node
    wakes its warm executor when it stored a message (:func:`start_supernode`'s ``wake``).

    ``warm_server`` (default: with the warm isolation): the SuperLink runs with ``--isolation
    process`` and its ServerApps are forked by :mod:`flower_vfl.deploy.warm_exec` (``--app
    serverapp``, started beside the SuperLink, with flwr, numpy, scipy, matplotlib and
    ``flower_vfl.apps.server`` imported while the SuperNodes start) instead of Flower's SuperExec
    starting a new ``flwr-serverapp`` interpreter for each run (:func:`start_server_exec`).
    """
    if warm_server is None:
        warm_server = isolation == "warm"
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r}; choose one of {ISOLATIONS}")
    if idle_poll is not None:
        from flower_vfl.deploy.supernode import check_idle_poll
        idle_poll = check_idle_poll(idle_poll)
    workdir = Path(workdir).resolve()
    home, logs = workdir / "flwr_home", workdir / "logs"
    env = loopback_env(home)
    link = free_port()
    pki = make_pki(workdir / "pki", num_parties) if (tls or auth) else None
    conn = write_connection(home, "loopback", f"127.0.0.1:{link}", pki["ca"] if tls else None)
    procs = processes or Processes(logs)
    record = None                            # the SuperLink's registry record, once started
    run_config = dict(run_config)
    if not run_config.get("out-dir"):           # '' (the CLI's default) too
        run_config["out-dir"] = str(workdir / "out")
    try:
        cmd = ["flower-superlink", "--port", link, "--disable-runtime-dependency-installation"]
        cmd += ["--ssl-ca-certfile", pki["ca"], "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"]] \
            if tls else ["--insecure"]
        if auth:
            cmd.append("--enable-supernode-auth")
        if warm_server:
            cmd += ["--isolation", "process"]
        superlink = procs.start("superlink", cmd, env, workdir)
        record = record_superlink(superlink, link, home, "deploy-local", logs / "superlink.log")
        if warm_server:
            start_server_exec(procs, link, env, workdir, root_certificates=pki["ca"] if tls else None,
                              parent_pid=superlink.pid)
        warm = WarmFlwr.start(env)              # the job's `flwr run`, importing while the nodes start
        _wait_port(link, procs.procs["superlink"], logs / "superlink.log")
        if auth:
            for m in range(num_parties):
                res = _flwr_json(["supernode", "register", str(pki["nodes"][m]["public"]), conn], env)
                if not res.get("success", True):
                    raise RuntimeError(f"flwr supernode register failed for node {m}: {res}")
        if auth and bind_keys:
            keys = workdir / "party-keys.json"
            keys.write_text(json.dumps({str(m): pki["nodes"][m]["fingerprint"] for m in range(num_parties)}))
            run_config.setdefault("party-keys", str(keys))
        zygote = None
        if fork_nodes and isolation == "warm" and idle_poll is not None:
            zygote = Zygote(procs, env, workdir)
        for m in range(num_parties):
            nc = {"partition-id": m, **(node_configs or {}).get(m, {})}
            # every SuperNode its own state folder (a deployed party refuses to start without one:
            # flower_vfl.privacy.store.default_state_dir), unless the caller names it
            nc.setdefault("state-dir", str(workdir / "state" / f"party{m}"))
            start_supernode(procs, f"node{m}", f"127.0.0.1:{link}", nc, env, workdir, exec_name=f"exec{m}",
                            root_certificates=pki["ca"] if tls else None,
                            auth_key=pki["nodes"][(node_keys or {}).get(m, m)]["private"] if auth else None,
                            idle_poll=None if idle_poll is None else idle_poll_for(num_parties, idle_poll),
                            isolation=isolation,
                            # the accountants' libraries (torch) only in a private party's executor
                            accountants="eager" if party_is_private(m, run_config, nc) else "auto", zygote=zygote,
                            hot_poll=None if idle_poll is None else hot_poll_for(num_parties))
        run_id = submit(Path(app_dir).resolve(), conn, _node_config(run_config), env, warm=warm)
        rec = wait_run(run_id, conn, env, logs / "run.log", timeout=timeout, echo=echo, on_line=on_line)
        return {"record": rec, "exit_code": exit_code(rec), "run_id": run_id,
                "out_dir": run_config["out-dir"], "logs": logs,
                "fingerprints": [n["fingerprint"] for n in pki["nodes"]] if pki else []}
    finally:
        if locals().get("warm") is not None:
            warm.close()
        if processes is None:
            procs.stop_all()
            if record is not None:
                record.unlink(missing_ok=True)


def start_server_exec(procs: Processes, link_port, env, cwd, *, root_certificates=None, parent_pid=None,
                      name="server-exec"):
    """The SuperExec of a SuperLink started with ``--isolation process`` on ``127.0.0.1:link_port``:
    :mod:`flower_vfl.deploy.warm_exec` with ``--app serverapp``, which forks each run's ServerApp
    (Flower's ``flwr-serverapp`` code, :func:`flower_vfl.deploy.warm_exec._run_serverapp`) from a
    process that imported flwr, numpy, scipy, matplotlib and ``flower_vfl.apps.server`` once. It asks
    the SuperLink for a task every ``$FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (:func:`loopback_env`:
    0.2 s); ``root_certificates`` None: the Runtime API without TLS; ``parent_pid``: it ends when
    that process (the SuperLink) does. On a Flower release it was not read in, it runs Flower's
    SuperExec unpatched (a new ``flwr-serverapp`` per run, as Flower's subprocess isolation does)."""
    cmd = [sys.executable, "-m", "flower_vfl.deploy.warm_exec", "--app", "serverapp",
           "--preload-package", "flower_vfl.apps.server", "--runtime-api-address", f"127.0.0.1:{link_port}"]
    cmd += ["--root-certificates", str(root_certificates)] if root_certificates else ["--insecure"]
    if parent_pid is not None:
        cmd += ["--parent-pid", str(parent_pid)]
    return procs.start(name, cmd, env, cwd)


def _wait_port(port, proc, log, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}; see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"flower-superlink did not listen on port {port} within {timeout:g} s; see {log}")
