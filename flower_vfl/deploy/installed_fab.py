"""A party's SuperNode does not send its forked ClientApps an app bundle (FAB) they already installed.

Flower (1.41 / 1.42) hands every ClientApp process its task input in one Runtime API call,
``PullTaskInput``, whose answer carries the run's FAB, content included, on every message: for
flower-vfl's bundle (every ``flower_vfl/**/*.py``, stored uncompressed) 1.6 MB each message, which
the node's HTTP server copies through its middleware and the ClientApp parses, hashes and (Flower)
unzips and verifies again. On real nodes this made a party's pull of its task input ~88 ms
against ~41 ms for Flower's empty app moving the same message bytes (docs/benchmarks.md).

Both ends are the party's own processes (its SuperNode and its warm executor,
:mod:`flower_vfl.deploy.warm_exec`), and each change is listed and version-checked in
:mod:`flower_vfl.flower_patches`:

- ``fab-announce`` (in a ClientApp forked by the warm executor): the request names the FABs this
  node's ClientApps installed, by their full SHA-256 (:func:`installed_fabs`: the notes
  ``$FLWR_HOME/apps/.flower-vfl-installed/<sha256>`` that the ``fab-reuse`` patch writes after
  Flower's own install of bytes with that SHA-256 succeeded, each naming the folder Flower
  installed them in). The names ride in a field of ``PullTaskInputRequest`` that Flower does not
  define (:data:`FIELD`; protobuf keeps a field it does not know when it parses and re-serializes,
  so Flower's own node ignores it and answers as always).
- ``fab-skip`` (in ``flower-vfl-supernode``, the servicer's ``pull_task_input``): when the run's
  FAB hash is one of those named, the answer's FAB keeps its hash and verifications but carries
  no content. Any other hash (a new bundle, another run's), and every request that names none
  (Flower's own ``flwr-clientapp``, a child of a node that installed nothing yet), gets the full
  content, as in Flower.
- A forked ClientApp that got a FAB without content for a hash it named runs the copy Flower
  installed from bytes of that SHA-256, and only when that copy's folder is exactly the one
  Flower then loads the app from (``get_project_dir(run.fab_id, run.fab_version, hash)``);
  otherwise the task fails (:data:`MISMATCH`): no code whose bytes were not verified against the
  run's FAB hash ever runs.

``FLOWER_VFL_FAB_RESEND=1`` (read by the node at start) turns ``fab-skip`` off: every message
carries the FAB's content again, as in Flower (benchmarks compare the two).
"""

from __future__ import annotations

import os
from pathlib import Path

# bound here, at import: a ClientApp forked by the warm executor drops every module of this package
# before Flower's code runs (its app comes from the FAB), so nothing of ours is imported there
from flower_vfl.flower_patches import applicable, replace

__all__ = ["FIELD", "NOTES", "ENV", "MAX_ANNOUNCED", "InstalledFab", "note_dir", "installed_fabs", "announcement",
           "announced", "resend_fabs", "serve_installed_fabs", "client_code_missing", "announce_installed_fabs"]

#: the field number of ``PullTaskInputRequest`` (which Flower 1.41/1.42 defines empty) that carries
#: the hashes a forked ClientApp announces: one length-delimited string, comma-separated hex SHA-256s
FIELD = 410_041
#: the folder under ``$FLWR_HOME/apps`` whose files (named by a FAB's SHA-256) name where Flower
#: installed that FAB's bytes (written by the warm executor's ``fab-reuse`` patch)
NOTES = ".flower-vfl-installed"
#: ``FLOWER_VFL_FAB_RESEND`` = 1/true/yes/on: the node sends every FAB's content to every ClientApp
ENV = "FLOWER_VFL_FAB_RESEND"
#: at most this many installed FABs are named in one request (the most recently installed)
MAX_ANNOUNCED = 8
_HEX = frozenset("0123456789abcdef")
#: why a forked ClientApp that got a FAB without content stops (hash, the folder it holds, the
#: folder Flower would load)
MISMATCH = ("flower-vfl: the node sent the FAB {} without its content, but the copy this node installed from "
            "those bytes is in {}, not in {} where Flower loads the app from; the task stops (nothing unverified "
            "runs). Restart the node with {}=1 to have it send every FAB's content")


class InstalledFab(bytes):
    """The content of a FAB the node did not send (empty bytes): where Flower installed that FAB's
    bytes before, verified against its SHA-256 (``path``) and that SHA-256 (``sha256``). The
    ``fab-reuse`` patch of ``install_from_fab`` returns ``path`` for it without extracting anything."""

    def __new__(cls, path, sha256: str):
        obj = super().__new__(cls, b"")
        obj.path, obj.sha256 = Path(path), str(sha256)
        return obj


def note_dir() -> Path:
    """``$FLWR_HOME/apps/.flower-vfl-installed`` (Flower's home as this process sees it)."""
    from flwr.common.constant import APP_DIR
    from flwr.supercore.utils import get_flwr_home
    return get_flwr_home() / APP_DIR / NOTES


def installed_fabs(folder: Path | None = None, limit: int = MAX_ANNOUNCED) -> dict[str, Path]:
    """SHA-256 -> installed folder of the FABs this node installed (notes whose folder still holds a
    ``pyproject.toml``), the ``limit`` most recently installed; {} when there are none."""
    folder = note_dir() if folder is None else Path(folder)
    try:
        entries = [e for e in os.scandir(folder) if len(e.name) == 64 and set(e.name) <= _HEX and e.is_file()]
    except OSError:
        return {}
    entries.sort(key=lambda e: e.stat().st_mtime_ns, reverse=True)
    out: dict[str, Path] = {}
    for e in entries:
        if len(out) >= limit:
            break
        try:
            path = Path(Path(e.path).read_text().strip())
        except (OSError, ValueError):
            continue
        if path.is_absolute() and (path / "pyproject.toml").is_file():
            out[e.name] = path
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def announcement(hashes) -> bytes:
    """The wire bytes of field :data:`FIELD` naming ``hashes`` (parsed into a ``PullTaskInputRequest``,
    which keeps them as a field it does not know)."""
    payload = ",".join(hashes).encode("ascii")
    return _varint(FIELD << 3 | 2) + _varint(len(payload)) + payload


def announced(request) -> frozenset[str]:
    """The SHA-256s a ``PullTaskInputRequest`` names in field :data:`FIELD` (hex, lower case, 64
    digits; anything else in it is ignored); empty when it names none."""
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
        fields = [f for f in UnknownFieldSet(request) if f.field_number == FIELD and f.wire_type == 2]
    except Exception:                        # noqa: BLE001 - no announcement: the full FAB, as in Flower
        return frozenset()
    out = set()
    for f in fields:
        try:
            names = bytes(f.data).decode("ascii").split(",")
        except (UnicodeDecodeError, TypeError):
            continue
        out |= {h for h in names if len(h) == 64 and set(h) <= _HEX}
    return frozenset(out)


def resend_fabs(environ=None) -> bool:
    """``$FLOWER_VFL_FAB_RESEND`` is 1/true/yes/on: the node sends every FAB's content (Flower's way)."""
    environ = os.environ if environ is None else environ
    return str(environ.get(ENV, "")).strip().lower() in ("1", "true", "yes", "on")


def _source(fn) -> str:
    import inspect
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


#: what the node logs the first time it sends a FAB without content (the hash's first 12 digits)
SKIP_LINE = ("[flower-vfl] FAB %s: sent without its content to the ClientApps that installed it (fab-skip; "
             "FLOWER_VFL_FAB_RESEND=1: always with it)")
#: what the node's handler (flwr.supernode.servicer.runtime.runtime_handlers.pull_task_input,
#: 1.41/1.42) answers with, which ``fab-skip`` keeps and then empties of the FAB's content
NODE_ANSWER = "fab=fab_to_proto(fab)"
#: what Flower's ClientApp process does with the FAB it pulled (run_clientapp, 1.41/1.42)
CLIENT_PULL = ("client.PullTaskInput(PullTaskInputRequest())", "fab = fab_from_proto(res.fab)")
CLIENT_USE = ("install_from_fab(fab.content, skip_prompt=True)",
              "get_project_dir(run.fab_id, run.fab_version, fab.hash_str)")


def serve_installed_fabs(environ=None) -> bool:
    """In ``flower-vfl-supernode`` (before its Runtime API serves): the ``fab-skip`` patch (the module
    docstring); returns whether it was applied (not with ``$FLOWER_VFL_FAB_RESEND`` set)."""
    if resend_fabs(environ):
        return False
    import importlib
    try:
        rh = importlib.import_module("flwr.supernode.servicer.runtime.runtime_handlers")
    except ImportError:
        rh = None
    handler = getattr(rh, "pull_task_input", None)
    if not applicable("fab-skip", ["flwr.supernode.servicer.runtime.runtime_handlers"] if rh is None else
                      [] if callable(handler) and NODE_ANSWER in _source(handler)
                      else [f"runtime_handlers.pull_task_input answering with {NODE_ANSWER}"]):
        return False

    said: set[str] = set()

    def pull_task_input(request, state, task):
        res = handler(request, state, task)
        held = announced(request)
        if held and res.HasField("fab") and res.fab.hash_str in held:
            res.fab.ClearField("content")     # the ClientApp runs the copy it installed from these bytes
            if res.fab.hash_str not in said:
                said.add(res.fab.hash_str)
                from logging import INFO

                from flwr.supercore import log
                log(INFO, SKIP_LINE, res.fab.hash_str[:12])
        return res

    replace("fab-skip", rh, "pull_task_input", pull_task_input)
    return True


class _Announcing:
    """The ClientApp's Runtime API client, whose ``PullTaskInput`` names the installed FABs."""

    def __init__(self, client, hashes):
        self._client, self._wire = client, announcement(hashes)

    def __getattr__(self, name):
        return getattr(self._client, name)

    def PullTaskInput(self, request):         # noqa: N802 - Flower's method name
        from flwr.proto.runtime_pb2 import PullTaskInputRequest
        req = PullTaskInputRequest()
        req.CopyFrom(request)
        req.MergeFromString(self._wire)
        return self._client.PullTaskInput(req)


#: runtime module -> what its code lacks of :data:`CLIENT_PULL` / :data:`CLIENT_USE` (read once, in the
#: warm process when it calls :func:`client_code_missing` before it forks: not in every message)
_MISSING: dict[str, list] = {}


def client_code_missing(runtime: str = "flwr.supernode.runtime.run_clientapp") -> list:
    """What Flower's ClientApp process code (``runtime``) lacks of what ``fab-announce`` was read
    against (empty: it is that code); read once per process."""
    if runtime not in _MISSING:
        import importlib
        rc = importlib.import_module(runtime)
        body, whole = _source(getattr(rc, "pull_task_input", None)), _source(getattr(rc, "run_clientapp", None))
        _MISSING[runtime] = [s for s in CLIENT_PULL if s not in body] + [s for s in CLIENT_USE if s not in whole]
    return _MISSING[runtime]


def announce_installed_fabs(runtime: str = "flwr.supernode.runtime.run_clientapp") -> bool:
    """In a ClientApp forked by the warm executor (before Flower's ``run_clientapp``): the
    ``fab-announce`` patch (the module docstring); returns whether it was applied."""
    import importlib

    rc = importlib.import_module(runtime)
    pull = getattr(rc, "pull_task_input", None)
    if not applicable("fab-announce", client_code_missing(runtime)):
        return False
    from flwr.common.config import get_project_dir
    from flwr.supercore.fab import Fab

    def pull_task_input(client):
        held = installed_fabs()
        if not held:
            return pull(client)
        message, context, run, fab = pull(_Announcing(client, held))
        if fab.content or fab.hash_str not in held:
            return message, context, run, fab        # the full FAB (or Flower's own failure)
        path, load = held[fab.hash_str], get_project_dir(run.fab_id, run.fab_version, fab.hash_str)
        if Path(os.path.abspath(path)) != Path(os.path.abspath(load)):
            raise RuntimeError(MISMATCH.format(fab.hash_str, path, load, ENV))
        return message, context, run, Fab(fab.hash_str, InstalledFab(path, fab.hash_str), fab.verifications)

    replace("fab-announce", rc, "pull_task_input", pull_task_input)
    return True
