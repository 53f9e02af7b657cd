"""The Flower patches in one place (flower_vfl/flower_patches.py): the installed Flower is a release
every patch was read in (this test fails after a Flower upgrade until each patch is re-read and its
releases extended), every listed target exists in it, a Flower release the list does not know gets
nothing patched and one warning line per patch naming it and the version, and no module of ours
sets an attribute of a Flower module except through the list."""

import ast
import importlib
import warnings
from pathlib import Path

import pytest

import flower_vfl
from flower_vfl import flower_patches as fp

PKG = Path(flower_vfl.__file__).resolve().parent


def _resolve(target):
    """(object, attribute, keyword or None) of a ``"module[.Class]:attribute"`` target."""
    owner, _, attr = target.partition(":")
    kw = None
    if ".__kwdefaults__[" in attr:
        attr, _, kw = attr.partition(".__kwdefaults__[")
        kw = kw.rstrip("]")
    try:
        obj = importlib.import_module(owner)
    except ImportError:
        mod, _, cls = owner.rpartition(".")
        obj = getattr(importlib.import_module(mod), cls)
    return obj, attr, kw


def test_the_installed_flower_is_a_release_every_patch_was_read_in():
    import flwr
    assert fp.known_release(), (
        f"flwr {flwr.__version__} is not one of {fp.FLOWER_RELEASES}: re-read every patch of "
        "flower_vfl/flower_patches.py (PATCHES) against this Flower, then extend FLOWER_RELEASES")
    assert all(fp.known_release(name=p.name) for p in fp.PATCHES)


def test_every_listed_target_exists_in_the_installed_flower():
    for p in fp.PATCHES:
        for t in p.targets:
            obj, attr, kw = _resolve(t)
            assert hasattr(obj, attr), f"{p.name}: {t}"
            if kw is not None:
                assert kw in (getattr(obj, attr).__kwdefaults__ or {}), f"{p.name}: {t}"


def test_the_version_check_refuses_a_release_it_does_not_know(monkeypatch):
    import flwr
    monkeypatch.setattr(flwr, "__version__", "1.43.0")
    assert not fp.known_release()
    with pytest.warns(fp.FlowerPatchWarning) as rec:
        assert fp.applicable("supernode-poll") is False
    assert [str(w.message) for w in rec] == [
        "flower-vfl: Flower patch 'supernode-poll' not applied (flwr 1.43.0 is not one of 1.41.x, 1.42.x); "
        "running Flower's SuperNode unpatched (Flower's own 3 s idle poll)"]


def test_a_changed_flower_is_named_by_what_it_lacks():
    import flwr
    with pytest.warns(fp.FlowerPatchWarning) as rec:
        assert fp.applicable("heartbeat-interval", ["", "x.HEARTBEAT_DEFAULT_INTERVAL=30"]) is False
    assert [str(w.message) for w in rec] == [
        f"flower-vfl: Flower patch 'heartbeat-interval' not applied (flwr {flwr.__version__}'s code has no "
        "x.HEARTBEAT_DEFAULT_INTERVAL=30); --heartbeat ignored, Flower's interval kept"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fp.applicable("heartbeat-interval", ["", ""]) is True


def test_a_target_the_list_does_not_name_is_refused():
    import flwr.supernode.start_client_internal as sci
    before = sci.time
    with pytest.raises(LookupError, match=r"^flower_vfl\.flower_patches: patch 'supernode-poll' does not list "
                                          r"'flwr\.supernode\.start_client_internal:sleep'; add it to PATCHES"):
        fp.replace("supernode-poll", sci, "sleep", None)
    assert sci.time is before and not hasattr(sci, "sleep")


def test_every_patch_site_leaves_an_unknown_flower_alone_and_says_which_patch(monkeypatch, tmp_path):
    """flwr 1.99.0: every site returns False, touches no listed target, and warns once naming its patch."""
    import flwr

    from flower_vfl.deploy import installed_fab, supernode, warm_exec
    from flower_vfl.strategies import sim_delivery

    before = {}
    for p in fp.PATCHES:
        for t in p.targets:
            obj, attr, kw = _resolve(t)
            before[t] = getattr(obj, attr).__kwdefaults__[kw] if kw else getattr(obj, attr)
    monkeypatch.setattr(flwr, "__version__", "1.99.0")
    monkeypatch.setattr(warm_exec, "_FORKABLE", [])
    monkeypatch.setattr(sim_delivery, "_found", {"thread": None, "event": None, "usable": None,
                                                 "warned": False, "woken": 0})
    monkeypatch.delenv(sim_delivery.ENV, raising=False)
    sites = {"supernode-poll": lambda: supernode.cap_idle_sleep(0.5, 0.02),
             "supernode-wake-executor": lambda: supernode.wake_executor(9),
             "object-retry-backoff": supernode.fast_object_retries,
             "activation-retry": supernode.retry_activation,
             "tls-mismatch-hint": supernode.hint_tls_mismatch,
             "heartbeat-interval": lambda: supernode.set_heartbeat(10),
             "serverapp-fork": warm_exec.serverapp_forkable,
             "serverapp-flush": warm_exec.patch_serverapp_flush,
             "force-exit-watch": lambda: warm_exec.watch_force_exit(1),
             "sim-delivery-wake": lambda: sim_delivery.warn_if_absent() or False,
             "fab-skip": lambda: installed_fab.serve_installed_fabs({}),
             "fab-announce": installed_fab.announce_installed_fabs}
    for name, site in sites.items():
        with pytest.warns(fp.FlowerPatchWarning) as rec:
            assert site() is False, name
        assert [str(w.message) for w in rec] == [
            f"flower-vfl: Flower patch '{name}' not applied (flwr 1.99.0 is not one of 1.41.x, 1.42.x); "
            f"{fp.patch(name).fallback}"], name
    for t, was in before.items():
        obj, attr, kw = _resolve(t)
        assert (getattr(obj, attr).__kwdefaults__[kw] if kw else getattr(obj, attr)) is was, t


def _flower_names(tree):
    """Names bound to a Flower module or object by an import anywhere in ``tree``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] if a.asname is None else a.asname
                    for a in node.names if a.name == "flwr" or a.name.startswith("flwr.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "flwr":
            out |= {a.asname or a.name for a in node.names}
    return out


def test_no_module_of_ours_sets_a_flower_attribute_but_through_the_list():
    """An assignment to (or setattr of) an attribute of a name imported from flwr, or to an attribute
    named as a listed target (``mod.flush_logs = ...`` on a module looked up at run time), outside
    flower_patches.py, is a patch that bypasses the list."""
    listed = {t.partition(":")[2].split(".__kwdefaults__")[0] for p in fp.PATCHES for t in p.targets}
    listed.add("__kwdefaults__")
    bad = []
    for path in PKG.rglob("*.py"):
        if path.name == "flower_patches.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _flower_names(tree)
        for node in ast.walk(tree):
            for t in (node.targets if isinstance(node, ast.Assign) else []):
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    while isinstance(el, ast.Subscript):
                        el = el.value
                    if isinstance(el, ast.Attribute) and el.attr in listed and \
                            not (isinstance(el.value, ast.Name) and el.value.id in ("self", "cls")):
                        bad.append(f"{path.relative_to(PKG)}:{node.lineno} .{el.attr}")
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign) else []
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    base = el.value if isinstance(el, (ast.Attribute, ast.Subscript)) else None
                    while isinstance(base, (ast.Attribute, ast.Subscript)):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id in names:
                        bad.append(f"{path.relative_to(PKG)}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in names:
                bad.append(f"{path.relative_to(PKG)}:{node.lineno}")
    # TaskIdentity's run/task/node id: Flower's own setters (what its runtime does), not a patch
    bad = [b for b in bad if not b.startswith("deploy/local_grid.py")]
    assert bad == []
