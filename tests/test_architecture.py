"""The package layout is the architecture of docs/architecture.md: no import circles (module
level or inside functions), every arrow between rooms is one the document allows, no Flower import
below the glue line, no private name (``_x``) imported from another room, and every route of the
registry (flower_vfl/routes) names pieces that exist, in the rooms a route may use."""

import ast
from pathlib import Path

import flower_vfl

PKG = Path(flower_vfl.__file__).resolve().parent

#: room -> the rooms it may import (docs/architecture.md, "Allowed arrows"); every room may
#: import the leaf ``errors``
BELOW_APPS = {"config", "estimator", "baselines", "reporting", "io", "privacy", "secagg", "horizontal",
              "datasets", "core", "routes.reference"}
#: the glue that may import Flower's runtime: the central nodes, the parties, the routes, the apps,
#: the deployment and the CLI, and the one module that patches Flower
GLUE = {"clients", "strategies", "routes", "apps", "deploy", "cli", "flower_patches"}
ALLOWED = {
    "errors": set(),
    "core": set(),
    "datasets": set(),
    "privacy": {"core"},
    "secagg": {"core"},
    "horizontal": {"datasets", "core"},                 # core: the one round loop (core/rounds.py)
    "io": {"privacy", "core"},
    "config": {"io", "privacy", "core"},
    "estimator": {"config", "io", "privacy", "core"},   # config: the parameter table (schema.PARAMS)
    "baselines": {"io", "privacy", "core", "routes.reference"},   # re-exports the SGD route's reference
    "routes.reference": {"io", "privacy", "core"},     # a route folder's in-process reference: no Flower
    "flower_patches": set(),                            # the list of Flower patches: imports nothing of ours
    "reporting": {"io", "privacy", "core"},
    "clients": {"config", "io", "reporting", "baselines", "horizontal", "privacy", "secagg", "core"},
    "strategies": {"config", "io", "reporting", "baselines", "horizontal", "privacy", "secagg", "core",
                   "flower_patches"},
    # a route folder's central node and party: what the strategies and clients may use, and them
    "routes": {"clients", "strategies", "config", "io", "reporting", "baselines", "horizontal", "privacy", "secagg",
               "core", "routes.reference"},
    "apps": {"routes", "clients", "strategies"} | BELOW_APPS,
    "deploy": BELOW_APPS | {"flower_patches"},
    "cli": {"deploy"} | BELOW_APPS,
    "root": {"estimator"},          # flower_vfl/__init__.py: VerticalADMM on first use
}
#: arrows that break the layering today, each to be removed (the test fails once it is gone, so
#: the entry is dropped with it): the old import paths of the vertical SGD route
#: (strategies/vertical_sgd.py, clients/vertical_sgd.py re-export routes/vertical_sgd/), kept for
#: existing callers
KNOWN: set = {("strategies", "routes"), ("clients", "routes")}
#: modules below the glue line that import flwr, each with why: Flower's record types only, never
#: its runtime
FLWR_BELOW = {
    "flower_vfl.io.wire": "the message wire format both ends share: Flower's Array/ArrayRecord/ConfigRecord/"
                          "RecordDict as .npy bytes in one ConfigRecord",
    "flower_vfl.errors": "reply_user_errors builds Flower's error reply, importing flwr inside the function",
}
#: private names imported from another module today (module, imported name), each to be removed by
#: its owner (made public or moved); the test fails once one is gone, so the entry is dropped with it.
#: Across rooms:
KNOWN_PRIVATE: set = set()


def _modules():
    mods = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
        mods[".".join(parts)] = p
    return mods


def _resolve(name, mods):
    while name and name not in mods:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name


def _edges(mods):
    """module -> the package modules it imports anywhere in its body (lazy imports included)."""
    edges = {}
    for name, path in mods.items():
        base = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    b = base.split(".")
                    m = ".".join(b[: len(b) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    m = node.module or ""
                if m.startswith("flower_vfl"):
                    for a in node.names:
                        full = f"{m}.{a.name}"
                        out.add(_resolve(full, mods) if full in mods else _resolve(m, mods))
            elif isinstance(node, ast.Import):
                out |= {_resolve(a.name, mods) for a in node.names if a.name.startswith("flower_vfl")}
        out.discard(name)
        out.discard("")
        edges[name] = out
    return edges


def _room(module):
    parts = module.split(".")
    if len(parts) == 4 and parts[1] == "routes" and parts[3] == "reference":
        return "routes.reference"                    # a route folder's in-process reference
    return "root" if len(parts) == 1 else parts[1]     # a module at the root is its own room (errors)


def _cycles(graph):
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_lazy_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_through_others():
    assert _cycles(_edges(_modules())) == []


def test_every_arrow_between_rooms_is_allowed_by_docs_architecture():
    mods = _modules()
    arrows = set()
    for a, targets in _edges(mods).items():
        for b in targets:
            ra, rb = _room(a), _room(b)
            if ra != rb and b != "flower_vfl" and rb != "errors":
                arrows.add((ra, rb))
    rooms = {_room(m) for m in mods}
    assert rooms <= set(ALLOWED), f"rooms missing from ALLOWED and docs/architecture.md: {rooms - set(ALLOWED)}"
    bad = {(a, b) for a, b in arrows if b not in ALLOWED[a]}
    assert bad - KNOWN == set(), "arrows docs/architecture.md does not allow"
    assert KNOWN <= bad, f"fixed, drop from KNOWN: {KNOWN - bad}"



def _imports_flwr(path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        if any(n == "flwr" or n.startswith("flwr.") for n in names):
            return True
    return False


def test_no_flower_import_below_the_glue_line():
    """Every room below the central nodes and the parties (the math, the services, a route's
    reference) imports no flwr, anywhere in a module, except the declared FLWR_BELOW."""
    mods = _modules()
    below = {m for m in mods if _room(m) not in GLUE and m != "flower_vfl"}
    assert {_room(m) for m in below} >= {"core", "privacy", "io", "estimator", "routes.reference"}
    found = {m for m in below if _imports_flwr(mods[m])}
    assert found == set(FLWR_BELOW), "flwr imported below the glue line (or a declared one no longer does)"


def test_no_private_name_is_imported_from_another_module():
    """``from flower_vfl.x import _name`` in another module: a helper another module needs is public
    (or moves); KNOWN_PRIVATE is empty and stays so."""
    mods = _modules()
    found = set()
    for m, path in mods.items():
        base = m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                b = base.split(".")
                src = ".".join(b[: len(b) - node.level + 1] + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if not src.startswith("flower_vfl"):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__") and _resolve(src, mods) != m:
                    found.add((m, f"{src}.{a.name}"))
    assert found - KNOWN_PRIVATE == set(), "private names imported from another module"
    assert KNOWN_PRIVATE <= found, f"fixed, drop from KNOWN_PRIVATE: {KNOWN_PRIVATE - found}"


def test_every_route_names_pieces_that_exist_in_the_rooms_a_route_may_use():
    """The registry names its pieces as strings (a party's process imports no central node): each
    resolves, its central node is a Flower Strategy, its party and central node live where a route's
    glue may (strategies, clients, routes), its reference below the glue line; the vertical app's
    routes are the run config's route values."""
    from flwr.serverapp.strategy import Strategy

    from flower_vfl import routes
    from flower_vfl.config.schema import SCHEMA
    for r in routes.REGISTRY:
        for piece in ("central", "party", "reference"):
            module = getattr(r, piece).partition(":")[0]
            room = _room(module)
            if piece == "reference":
                assert room not in GLUE, (r.name, module)
            else:
                assert room in {"strategies", "clients", "routes"}, (r.name, module)
            assert r.load(piece) is not None
        assert issubclass(r.load("central"), Strategy), r.name
        if r.handlers is not None:
            assert sorted(r.load("handlers")) == sorted(r.messages), r.name
    assert sorted(SCHEMA["route"].choices) == sorted(r.name for r in routes.for_app("vertical"))


# ---------------------------------------------------------------------- one round loop
def _own_loops(fn) -> list[str]:
    """The round loops written in ``fn``'s own body (not in the functions or lambdas it defines: a
    round's step): every ``while``, and every ``for`` whose iterable counts with ``range`` (also
    wrapped, e.g. ``tqdm(range(...))``), as ``"line: source"``."""
    found, todo = [], list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        counts = isinstance(node, (ast.For, ast.AsyncFor)) and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range"
            for n in ast.walk(node.iter))
        if counts or isinstance(node, ast.While):
            found.append(f"{node.lineno}: {ast.unparse(node).splitlines()[0]}")
        todo.extend(ast.iter_child_nodes(node))
    return found


def _function(obj):
    """The AST of a function or method object, and the AST of its module."""
    import inspect
    module = ast.parse(Path(inspect.getsourcefile(obj)).read_text(encoding="utf-8"))
    line = inspect.unwrap(obj).__code__.co_firstlineno
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.lineno == line or (node.decorator_list and node.decorator_list[0].lineno == line)):
            return node, module
    raise AssertionError(f"no definition of {obj!r} at line {line}")


def _round_drivers():
    """name -> the function that drives a route's rounds: every central node's ``run`` (the
    registry's central nodes and every ``CentralBase`` subclass they load), every in-process
    reference's ``fit`` (a class) or the reference function and the module functions its own body
    calls (``run_dpiadmm`` -> ``run_dpiadmm_many``)."""
    import inspect

    from flower_vfl import routes
    from flower_vfl.strategies.base import CentralBase
    out = {}
    for r in routes.REGISTRY:
        r.load("central")
        ref = r.load("reference")
        if inspect.isclass(ref):
            out[f"{r.name} reference {ref.__name__}.fit"] = _function(ref.fit)[0]
            continue
        fn, module = _function(ref)
        defs = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
        todo = [fn]
        while todo:
            f = todo.pop()
            key = f"{r.name} reference {f.name}"
            if key in out:
                continue
            out[key] = f
            own = [n for n in ast.walk(ast.Module(body=f.body, type_ignores=[]))]
            todo += [defs[n.func.id] for n in own if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                     and n.func.id in defs]
    todo = [CentralBase]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "run" in vars(cls) and cls is not CentralBase:
            out[f"{cls.__module__}.{cls.__name__}.run"] = _function(cls.run)[0]
    return out


def test_the_round_loop_finder_finds_a_loop_of_rounds_but_not_a_step_s():
    src = ("def run(self, grid, state):\n"
           "    def step(epoch):\n"
           "        for j in range(n_batches):\n"
           "            pass\n"
           "    for fit in (0, 1):\n"
           "        pass\n"
           "    for epoch in tqdm(range(1, epochs + 1)):\n"
           "        for j in range(nb):\n"
           "            pass\n"
           "    while not done:\n"
           "        pass\n")
    found = _own_loops(ast.parse(src).body[0])
    assert sorted(found) == ["10: while not done:", "7: for epoch in tqdm(range(1, epochs + 1)):",
                             "8: for j in range(nb):"]


def test_every_route_runs_the_one_round_loop():
    """Every route's rounds are counted by ``core/rounds.py``'s ``run_rounds`` (directly, or through
    ``RoundDriver``'s phases): no central node's ``run`` (the registry's, every ``CentralBase``
    subclass) and no route's in-process reference counts rounds with a loop of its own (a ``for``
    over ``range`` or a ``while`` in its own body; a round's step, a function it defines, may loop
    over batches or parties)."""
    drivers = _round_drivers()
    names = set(drivers)
    assert {"flower_vfl.routes.vertical_sgd.central.VerticalSGDStrategy.run",
            "flower_vfl.strategies.dpiadmm.DPIADMMStrategy.run",
            "flower_vfl.strategies.vertical_admm.VerticalADMMStrategy.run",
            "vertical-sgd reference VerticalSGD.fit", "horizontal-dpiadmm reference run_dpiadmm_many",
            "admm reference VerticalADMM.fit"} <= names, sorted(names)
    loops = {name: found for name, fn in drivers.items() if (found := _own_loops(fn))}
    assert loops == {}, "a route counts its rounds itself: call flower_vfl.core.rounds.run_rounds"

