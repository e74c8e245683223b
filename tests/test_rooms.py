"""The house's rules that the code alone can state (docs/architecture.md): the slot is the
manager's, and a backend never reaches back into the manager."""
import ast
from pathlib import Path
from typing import Iterator, List, Tuple

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


def test_a_ray_host_is_written_only_by_its_own_methods():
    """NOTE [ Hosts ]: RayBackend asks a _Host to change; it never sets a host's fields itself."""
    tree = ast.parse((PACKAGE / "ray" / "backend.py").read_text())
    backend = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayBackend")
    written = []
    for node in ast.walk(backend):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in [t for each in targets for t in (each.elts if isinstance(each, ast.Tuple) else [each])]:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "host":
                written.append(f"host.{target.attr} (line {target.lineno})")
    assert written == []
