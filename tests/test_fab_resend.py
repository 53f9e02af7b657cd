"""A party's node does not re-send an app bundle (FAB) its forked ClientApps installed
(flower_vfl/deploy/installed_fab.py, the ``fab-announce`` / ``fab-skip`` patches).

In process, through Flower's own code on both ends: the ClientApp side is Flower's
``run_clientapp.pull_task_input`` (patched as a forked child of the warm executor patches it) and
``install_from_fab``; the node side is the SuperNode servicer's ``pull_task_input`` handler (patched
as ``flower-vfl-supernode`` patches it); between them the request and the answer go through
protobuf's wire bytes, as over the node's Runtime API. The real-node run is in
tests/test_warm_exec.py (slow)."""

import hashlib
import warnings
import zipfile

import pytest

from flower_vfl import flower_patches as fp
from flower_vfl.deploy import installed_fab as inf

RC = "flwr.supernode.runtime.run_clientapp"
RH = "flwr.supernode.servicer.runtime.runtime_handlers"


def _fab_bytes(tag: str) -> bytes:
    """A real FAB (Flower's own builder) of a one-module app; ``tag`` changes its bytes."""
    from flwr.cli.build import build_fab_from_files
    pyproject = (b'[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
                 b'[project]\nname = "tinyapp"\nversion = "1.0.0"\ndependencies = []\n'
                 b'[tool.flwr.app]\npublisher = "tester"\n[tool.flwr.app.components]\n'
                 b'serverapp = "tinyapp.s:app"\nclientapp = "tinyapp.c:app"\n[tool.flwr.app.config]\n')
    fab, _ = build_fab_from_files({"pyproject.toml": pyproject, "tinyapp/__init__.py": b"",
                                   "tinyapp/c.py": f"TAG = {tag!r}\n".encode()})
    return fab


class _Node:
    """The node's side: its state (one run, its FAB and context, one task) and the servicer handler
    of the installed Flower (patched or not), reached through protobuf wire bytes."""

    def __init__(self, fab: bytes, fab_id="tester/tinyapp", version="1.0.0"):
        import importlib

        from flwr.app import Context, RecordDict
        from flwr.supercore.fab import Fab
        from flwr.supercore.run import Run

        self.rh = importlib.import_module(RH)
        self.fab = Fab(hashlib.sha256(fab).hexdigest(), fab, {})
        self.run = Run.create_empty(7)
        self.run.fab_id, self.run.fab_version, self.run.fab_hash = fab_id, version, self.fab.hash_str
        self.context = Context(run_id=7, node_id=3, node_config={}, state=RecordDict(), run_config={})
        self.message = None
        self.requests, self.answers = [], []

    # the NodeState calls of the handler
    def get_run(self, run_id):
        return self.run

    def get_run_series_context(self, series_id):
        return self.context

    def get_fab(self, fab_hash):
        return self.fab if fab_hash == self.fab.hash_str else None

    def activate_task(self, task_id):
        return True

    # the Runtime API client of the ClientApp
    def PullTaskInput(self, request):                     # noqa: N802
        from flwr.proto.runtime_pb2 import PullTaskInputRequest, PullTaskInputResponse
        from flwr.proto.task_pb2 import Task
        wire = request.SerializeToString(deterministic=True)
        self.requests.append(wire)
        res = self.rh.pull_task_input(PullTaskInputRequest.FromString(wire), self, Task(task_id=5, run_id=7))
        self.answers.append(res.SerializeToString())
        return PullTaskInputResponse.FromString(self.answers[-1])

    def PullMessages(self, request):                      # noqa: N802
        from flwr.app.message import remove_content_from_message
        from flwr.common.serde import message_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse
        from flwr.app import Message, RecordDict
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
        # the message the node holds (made after PullTaskInput, which set Flower's TaskIdentity)
        self.message = Message(RecordDict(), dst_node_id=3, message_type="train")
        self.objects = get_all_nested_objects(self.message)
        return PullAppMessagesResponse(messages_list=[message_to_proto(remove_content_from_message(self.message))],
                                       message_object_trees=[get_object_tree(self.message)])

    def PullObject(self, request):                        # noqa: N802
        from flwr.proto.message_pb2 import PullObjectResponse
        return PullObjectResponse(object_found=True, object_available=True,
                                  object_content=self.objects[request.object_id].deflate())

    def ConfirmMessageReceived(self, request):            # noqa: N802
        from flwr.proto.message_pb2 import ConfirmMessageReceivedResponse
        return ConfirmMessageReceivedResponse()


@pytest.fixture
def child(monkeypatch, tmp_path):
    """A forked ClientApp's patches (fab-reuse, fab-announce) and the node's (fab-skip) on the
    installed Flower, undone after the test; Flower's home in ``tmp_path``."""
    import importlib

    from flwr.supercore.task_identity import TaskIdentity

    from flower_vfl.deploy import warm_exec
    rc, rh = importlib.import_module(RC), importlib.import_module(RH)
    for name in ("_task_id", "_run_id", "_node_id"):      # Flower's pull sets them; restored after
        monkeypatch.setattr(TaskIdentity, name, getattr(TaskIdentity, name, None))
    for mod, name in ((rc, "pull_task_input"), (rc, "install_from_fab"), (rh, "pull_task_input")):
        monkeypatch.setattr(mod, name, getattr(mod, name))
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    monkeypatch.delenv(inf.ENV, raising=False)
    installs = []
    flower_install = rc.install_from_fab

    def counted(fab_file, install_dir=None, skip_prompt=False):
        installs.append(hashlib.sha256(fab_file).hexdigest())
        return flower_install(fab_file, install_dir, skip_prompt)
    monkeypatch.setattr(rc, "install_from_fab", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # every patch applies on this Flower
        warm_exec._reuse_installed_fabs(warm_exec.CLIENT_RUNTIME)
        assert inf.serve_installed_fabs() is True
    return rc, installs


def _message(rc, node):
    """What Flower's run_clientapp does with its task input up to loading the app: pull, install,
    the folder it loads the ClientApp from (and that folder's module)."""
    from flwr.common.config import get_project_dir
    message, context, run, fab = rc.pull_task_input(node)
    rc.install_from_fab(fab.content, skip_prompt=True)
    folder = get_project_dir(run.fab_id, run.fab_version, fab.hash_str)
    return message, fab, folder, (folder / "tinyapp" / "c.py").read_text()


def _content_sent(node) -> int:
    from flwr.proto.runtime_pb2 import PullTaskInputResponse
    return len(PullTaskInputResponse.FromString(node.answers[-1]).fab.content)


def test_a_child_that_installed_the_fab_gets_no_content_and_runs_the_installed_copy(child):
    rc, installs = child
    fab = _fab_bytes("one")
    node = _Node(fab)
    msg, got, folder, code = _message(rc, node)            # first message: nothing installed yet
    assert _content_sent(node) == len(fab) and installs == [node.fab.hash_str]
    assert inf.announced(_parse(node.requests[-1])) == frozenset()
    assert code == "TAG = 'one'\n" and msg.metadata.message_type == "train"
    msg2, got2, folder2, code2 = _message(rc, node)         # second: named as installed, no content
    assert inf.announced(_parse(node.requests[-1])) == {node.fab.hash_str}
    assert _content_sent(node) == 0 and len(node.answers[-1]) < 1000
    assert isinstance(got2.content, inf.InstalledFab) and got2.hash_str == node.fab.hash_str
    assert (folder2, code2) == (folder, code) and installs == [node.fab.hash_str]   # no install, same copy
    assert msg2.metadata.message_type == "train"


def test_another_fab_hash_gets_the_content(child):
    rc, installs = child
    one, two = _fab_bytes("one"), _fab_bytes("two")
    _message(rc, _Node(one))
    node = _Node(two)
    _, got, _, code = _message(rc, node)
    assert inf.announced(_parse(node.requests[-1])) == {hashlib.sha256(one).hexdigest()}
    assert _content_sent(node) == len(two) and got.content == two and code == "TAG = 'two'\n"
    assert installs == [hashlib.sha256(one).hexdigest(), hashlib.sha256(two).hexdigest()]


def test_a_request_that_names_nothing_gets_the_content_from_the_patched_node(child):
    """Flower's own flwr-clientapp (and a child whose node installed nothing) names no FAB."""
    from flwr.proto.runtime_pb2 import PullTaskInputRequest
    from flwr.proto.task_pb2 import Task
    rc, _ = child
    fab = _fab_bytes("one")
    _message(rc, _Node(fab))                                # installed (a note exists)
    node = _Node(fab)
    res = node.rh.pull_task_input(PullTaskInputRequest(), node, Task(task_id=5, run_id=7))
    assert res.fab.content == fab and res.fab.hash_str == hashlib.sha256(fab).hexdigest()


def test_resend_switch_sends_the_content_to_a_child_that_installed_it(monkeypatch, tmp_path):
    import importlib
    rh = importlib.import_module(RH)
    monkeypatch.setattr(rh, "pull_task_input", rh.pull_task_input)
    before = rh.pull_task_input
    assert inf.serve_installed_fabs({inf.ENV: "1"}) is False and rh.pull_task_input is before
    from flwr.proto.task_pb2 import Task
    fab = _fab_bytes("one")
    node = _Node(fab)
    res = rh.pull_task_input(_parse(inf.announcement([node.fab.hash_str])), node, Task(task_id=5, run_id=7))
    assert res.fab.content == fab


def test_an_installed_copy_in_another_folder_than_flower_loads_is_refused(child):
    """The node sends no content for the hash the child named, but the run names another app
    (fab_id): the folder Flower would load is not the one installed from those bytes; the task stops."""
    rc, installs = child
    fab = _fab_bytes("one")
    _, _, folder, _ = _message(rc, _Node(fab))
    other = _Node(fab, fab_id="tester/otherapp")
    with pytest.raises(RuntimeError) as err:
        rc.pull_task_input(other)
    h = hashlib.sha256(fab).hexdigest()
    assert str(err.value) == inf.MISMATCH.format(h, folder, folder.parent / f"tester.otherapp.1.0.0.{h[:8]}", inf.ENV)
    assert installs == [h]


def test_an_empty_fab_for_a_hash_not_named_is_flowers_failure(child):
    """A node that sends no content for a hash the child did not name: nothing is taken from disk;
    Flower's install of the empty bytes fails as in Flower."""
    rc, _ = child
    fab = _fab_bytes("one")
    node = _Node(fab)
    node.fab.content = b""
    _, _, run, got = rc.pull_task_input(node)
    assert got.content == b"" and not isinstance(got.content, inf.InstalledFab)
    with pytest.raises(zipfile.BadZipFile):
        rc.install_from_fab(got.content, skip_prompt=True)


def test_announcement_wire_format_and_bad_names():
    h = "ab" * 32
    req = _parse(inf.announcement([h, "cd" * 32]))
    assert inf.announced(req) == {h, "cd" * 32}
    assert inf.announced(_parse(inf.announcement(["../etc", "AB" * 32, h + "0", h]))) == {h}
    from flwr.proto.runtime_pb2 import PullTaskInputRequest
    assert inf.announced(PullTaskInputRequest()) == frozenset()


def test_installed_fabs_lists_only_notes_whose_folder_holds_an_app(tmp_path):
    import os
    app = tmp_path / "apps" / "a"
    app.mkdir(parents=True)
    (app / "pyproject.toml").write_text("")
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(inf.MAX_ANNOUNCED + 2):
        (notes / (f"{i:02d}" * 32)).write_text(str(app))
        os.utime(notes / (f"{i:02d}" * 32), ns=(10**9 * i, 10**9 * i))
    (notes / ("ff" * 32)).write_text(str(tmp_path / "gone"))
    (notes / "not-a-hash").write_text(str(app))
    got = inf.installed_fabs(notes)
    assert sorted(got) == sorted(f"{i:02d}" * 32 for i in range(2, inf.MAX_ANNOUNCED + 2))
    assert set(got.values()) == {app}
    assert inf.installed_fabs(tmp_path / "none") == {}


def test_fab_patches_name_the_flower_code_they_miss(monkeypatch):
    import importlib

    import flwr
    rh = importlib.import_module(RH)

    def pull_task_input(request, state, task):            # a Flower whose handler answers otherwise
        return None
    monkeypatch.setattr(rh, "pull_task_input", pull_task_input)
    with pytest.warns(fp.FlowerPatchWarning) as rec:
        assert inf.serve_installed_fabs({}) is False
    assert [str(w.message) for w in rec] == [
        f"flower-vfl: Flower patch 'fab-skip' not applied (flwr {flwr.__version__}'s code has no "
        f"runtime_handlers.pull_task_input answering with {inf.NODE_ANSWER}); {fp.patch('fab-skip').fallback}"]
    assert rh.pull_task_input is pull_task_input


def _parse(wire: bytes):
    from flwr.proto.runtime_pb2 import PullTaskInputRequest
    return PullTaskInputRequest.FromString(wire)



# ------------------------------------------------------------------ the rest of a party's message:
# the solver cache's key takes the block cache's digest instead of a SHA-256 pass over the block

def _libsvm(path, n, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    lines = [("+1" if rng.random() < 0.4 else "-1") + " " + " ".join(
        f"{c}:1" for c in np.sort(rng.choice(np.arange(1, 124), size=rng.integers(3, 15), replace=False)))
        for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")


def test_the_solver_key_of_a_cached_block_is_its_cache_files_checksum(tmp_path, monkeypatch):
    """The key names the block's content as the cache file's checksum (SHA-256 over the block's
    arrays) on every path a block comes from (parsed and written, read and verified, memory-mapped
    after verification); any other object (a copy, a fresh parse) is hashed in full as before; a
    block of other content gets another key."""
    import numpy as np

    from flower_vfl.clients.party_public import _fingerprint
    from flower_vfl.io import data as data_mod
    from flower_vfl.io import party_cache as pc

    def forget():
        data_mod.party_block.cache_clear()
        data_mod.load_all.cache_clear()
        pc._MEMO.clear()
    monkeypatch.setenv("FLOWER_VFL_CACHE", str(tmp_path / "bundled"))
    monkeypatch.delenv("FLOWER_VFL_BLOCK_CACHE", raising=False)
    d, state = tmp_path / "a9a", str(tmp_path / "party0")
    d.mkdir()
    _libsvm(d / "a9a", 60, 0)
    _libsvm(d / "a9a.t", 25, 1)
    forget()
    try:
        D1, _ = pc.cached_party_block("a9a", 0, 2, str(d), state)         # parsed, then written
        (path,) = (tmp_path / "party0" / "block-cache").glob("*.npz")
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files if k != "checksum"}
        key = ("csr_matrix", D1.shape, "block-cache:" + pc._digest(arrays) + ":train")
        assert _fingerprint(D1) == key
        forget()
        D2, _ = pc.cached_party_block("a9a", 0, 2, str(d), state)         # verified at its write: mapped
        forget()
        (path.parent / pc.VERIFIED).unlink()
        D3, _ = pc.cached_party_block("a9a", 0, 2, str(d), state)         # read and its checksum checked
        assert (D2.data.flags.writeable, D3.data.flags.writeable) == (False, True)
        assert _fingerprint(D2) == key and _fingerprint(D3) == key
        full = _fingerprint(D2.copy())
        fresh = data_mod.party_block("a9a", 0, 2, str(d))[0]
        assert full == _fingerprint(fresh) and full[2] != key[2] and len(full[2]) == 64
        other, _ = pc.cached_party_block("a9a", 1, 2, str(d), str(tmp_path / "party1"))
        assert _fingerprint(other)[2].startswith("block-cache:") and _fingerprint(other)[2] != key[2]
    finally:
        forget()
