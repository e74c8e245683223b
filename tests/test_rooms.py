"""The house's rules that the code alone can state (docs/architecture.md): the slot is the
manager's, a backend never reaches back into the manager, workers and Ray actors import core/'s
light vocabulary only, and the Linux layer is imported behind a platform check."""
import ast
import functools
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Sequence, Tuple

import pytest

import mlagents_plugin

PACKAGE = Path(mlagents_plugin.__file__).parent
pytestmark = pytest.mark.fast


def _modules() -> Iterator[Tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def _imported_names(tree: ast.Module, module: str) -> List[str]:
    return [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == module
        for alias in node.names
    ]


def test_no_module_outside_core_holds_a_slot():
    """Backends get WorkerRef values and report events; only the manager's transitions change a slot."""
    holders = [
        name
        for name, tree in _modules()
        if not name.startswith("core/") and "Slot" in _imported_names(tree, "mlagents_plugin.core.lifecycle")
    ]
    assert holders == []


def test_no_backend_imports_the_manager():
    """A backend reports in events; it neither calls back into the manager nor imports it."""
    backends = [
        name
        for name, tree in _modules()
        if any(isinstance(node, ast.ClassDef) and any(_base_name(b) == "Backend" for b in node.bases)
               for node in ast.walk(tree))
    ]
    assert {"local/backend.py", "ray/backend.py"} <= set(backends)
    for name, tree in _modules():
        if name in backends or name == "ray/actor.py":
            assert _imported_names(tree, "mlagents_plugin.core.manager") == [], name


def _base_name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _written(node: ast.AST) -> Iterator[str]:
    """``name.attribute (line n)`` for each attribute of a name that ``node`` assigns to."""
    for each in ast.walk(node):
        targets = each.targets if isinstance(each, ast.Assign) else [each.target] if isinstance(
            each, (ast.AugAssign, ast.AnnAssign)) else []
        for target in [t for x in targets for t in (x.elts if isinstance(x, ast.Tuple) else [x])]:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                yield f"{target.value.id}.{target.attr} (line {target.lineno})"


def test_a_ray_host_is_a_record_that_only_ray_backend_writes():
    """NOTE [ Hosts ]: a _Host is data; no code of ray/backend.py but RayBackend's writes a host."""
    tree = ast.parse((PACKAGE / "ray" / "backend.py").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert [w for w in _written(classes["_Host"]) if w.startswith("self.")] == []
    elsewhere = [n for n in tree.body if n is not classes["RayBackend"]]
    assert [w for n in elsewhere for w in _written(n) if w.startswith("host.")] == []


def _dotted(name: str) -> str:
    """``core/wire.py`` as ``mlagents_plugin.core.wire``."""
    return ".".join(["mlagents_plugin", *name.removesuffix(".py").split("/")]).removesuffix(".__init__")


def _imports(nodes: Iterable[ast.AST], on_linux: bool = False) -> Iterator[Tuple[str, bool]]:
    """Each module imported when ``nodes`` run, at the top or in a function (not under ``if
    TYPE_CHECKING:``), and whether under a Linux check; ``from a import b`` gives ``a.b`` too."""
    for node in nodes:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            yield from _imports(node.orelse, on_linux)
            continue
        if isinstance(node, ast.If) and _linux_only(node.test):
            yield from _imports(node.body, True)
            yield from _imports(node.orelse, on_linux)
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, on_linux) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, on_linux
            yield from ((f"{node.module}.{alias.name}", on_linux) for alias in node.names)
        yield from _imports(ast.iter_child_nodes(node), on_linux)


def _linux_only(test: ast.expr) -> bool:
    """``sys.platform == "linux"``, alone or in an ``and``: what mypy reads as Linux only."""
    operands = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    return any(ast.unparse(operand) == "sys.platform == 'linux'" for operand in operands)


@functools.lru_cache(maxsize=None)
def _package() -> Dict[str, Tuple[str, ast.Module]]:
    """Each module of the package by dotted name, with its path and tree."""
    return {_dotted(name): (name, tree) for name, tree in _modules()}


def _closure(start: str) -> Dict[str, List[str]]:
    """The package's modules that importing ``start`` runs (its packages, and every import at the
    top or in a function, on any platform), each with the other projects' modules it imports."""
    trees = _package()
    found: Dict[str, List[str]] = {}
    todo = [_dotted(start)]
    while todo:
        module = todo.pop()
        if module not in trees or trees[module][0] in found:
            continue
        name, tree = trees[module]
        imported = [imported for imported, _ in _imports(tree.body)]
        found[name] = [m for m in imported if m.split(".")[0] != "mlagents_plugin"]
        todo += [m for m in imported if m.split(".")[0] == "mlagents_plugin"] + [module.rpartition(".")[0]]
    return found


# core/'s light vocabulary: what a worker process, its fork server and a Ray actor import
# (docs/architecture.md). The rest of core/ is the trainer's side: the manager and what it uses.
LIGHT_CORE = {
    "core/__init__.py", "core/backend.py", "core/errors.py", "core/factories.py", "core/internals.py",
    "core/lifecycle.py", "core/names.py", "core/placement.py", "core/platform.py", "core/protocol.py",
    "core/settings.py", "core/signals.py", "core/wire.py",
}
# ML-Agents' settings, which load no torch: core/settings.py's ConfigError is a TrainerConfigError,
# and the section is resolved against RunOptions. A Ray actor imports it (EnvManagerSettings); a
# worker and a fork server do not.
TRAINER_SETTINGS = ("mlagents.trainers.settings", "mlagents.trainers.exception")


def _heavy(closure: Dict[str, List[str]], allowed: Sequence[str]) -> List[str]:
    """What of ML-Agents' trainers (the ``mlagents`` package, but ``allowed``) and of torch the
    modules of ``closure`` import."""
    return sorted(
        f"{name} imports {module}"
        for name, imported in closure.items()
        for module in imported
        if module.split(".")[0] in ("mlagents", "torch")
        and not any(module == a or module.startswith(a + ".") for a in allowed)
    )


@pytest.mark.parametrize(
    "entry, allowed",
    [("local/worker.py", ()), ("local/fork_server.py", ()), ("ray/actor.py", TRAINER_SETTINGS)],
    ids=["worker", "fork server", "ray actor"],
)
def test_workers_and_ray_actors_import_only_cores_light_vocabulary(entry, allowed):
    """A worker starts in milliseconds without ML-Agents' trainers and torch (NOTE [ Workers get no
    trainer settings ]), and so does a Ray actor's ProcessBackend; a core/ module they come to
    import is light, and said so here and in docs/architecture.md."""
    closure = _closure(entry)
    assert {name for name in closure if name.startswith("core/")} <= LIGHT_CORE
    assert _heavy(closure, allowed) == []


def test_cores_light_vocabulary_loads_neither_the_trainers_nor_torch():
    for name in sorted(LIGHT_CORE):
        assert _heavy(_closure(name), TRAINER_SETTINGS) == [], name


def test_dependencies_point_inward():
    """core/ imports no backend; local/ imports neither ray/ nor integration/ (a worker's hooks,
    rpc_server.py among them, live in local/)."""
    outward = {"core/": ("local", "ray"), "local/": ("ray", "integration")}
    backwards = [
        f"{name} imports {module}"
        for name, tree in _modules()
        for room, others in outward.items()
        if name.startswith(room)
        for module, _ in _imports(tree.body)
        if module.split(".")[:2] in [["mlagents_plugin", other] for other in others]
    ]
    assert backwards == []


def test_the_linux_layer_is_imported_only_behind_a_platform_check():
    """NOTE [ Portable core, Linux hardening ]: outside local/linux/, each import of it is under
    ``if sys.platform == "linux"``, so the rest imports, and type-checks, on macOS and Windows."""
    unguarded = [
        f"{name} imports {module}"
        for name, tree in _modules()
        if not name.startswith("local/linux/")
        for module, on_linux in _imports(tree.body)
        if module.startswith("mlagents_plugin.local.linux") and not on_linux
    ]
    assert unguarded == []
