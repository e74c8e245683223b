"""How an env factory reaches a worker process, which may be a fresh interpreter or on another
machine: cloudpickled, with what a fork server can preload (NOTE [ Shipping env factories ])."""
import functools
import importlib.metadata
import io
import os
import pickle
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Callable, List, Optional, Set

import cloudpickle


# NOTE [ Shipping env factories ]
# Under spawn and forkserver a worker is a fresh interpreter: it has the trainer's sys.path but
# none of the modules the trainer imported by other means, such as a test module pytest loaded
# with ``--import-mode=importlib`` or a module built at run time and put into sys.modules.
# cloudpickle pickles functions *by reference* to their module, which the worker would then fail
# to import. So, before pickling, every module the factory refers to that a fresh process could
# not import by name is registered with cloudpickle to be pickled *by value*, and unregistered
# right after. A Ray actor may run on another machine, with another sys.path: for it, every
# module that is neither the standard library's nor part of an installed distribution (a user's
# script beside the YAML, a test module) is shipped by value. Installed ones must be installed on
# every node, as mlagents_plugin itself must be (docs/ray.md).
def dumps_factory(factory: Callable[..., Any], other_machines: bool = False) -> bytes:
    """cloudpickle ``factory`` so that a fresh worker process (on another machine: with
    ``other_machines``) can load it."""
    shippable = _installed if other_machines else _importable_by_name
    by_value = [m for m in _referenced_modules(factory) if not shippable(m)]
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(factory)
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)


def modules_to_load(pickled_factory: bytes) -> List[str]:
    """The modules a worker imports to unpickle ``pickled_factory``, as a fork server can
    preload them (NOTE [ Worker start-up ] in worker.py). Loads the factory once, here, where
    every such module is imported already."""
    found: Set[str] = set()

    class _Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            found.add(module)
            return super().find_class(module, name)

    _Recorder(io.BytesIO(pickled_factory)).load()
    return sorted(name for name in found if name != "__main__" and name in sys.modules)


def _referenced_modules(obj: Any) -> List[ModuleType]:
    """Modules of the callables and classes ``obj`` is made of, looking through partials,
    bound methods and containers (an exception type passed as a keyword argument counts)."""
    names: Set[str] = set()
    pending = [obj]
    while pending:
        item = pending.pop()
        if isinstance(item, functools.partial):
            pending.append(item.func)
            pending.extend(item.args)
            pending.extend(item.keywords.values())
            continue
        if isinstance(item, (list, tuple, set, frozenset)):
            pending.extend(item)
            continue
        if isinstance(item, dict):
            pending.extend(item.values())
            continue
        # what a closure or default argument holds (e.g. an exception type the factory raises)
        pending.extend(_closure_contents(item))
        pending.extend(getattr(item, "__defaults__", None) or ())
        owner = getattr(item, "__self__", None)
        if owner is not None and not isinstance(owner, ModuleType):
            pending.append(type(owner))
        module_name = getattr(item, "__module__", None)
        if isinstance(module_name, str):
            names.add(module_name)
    names.discard("__main__")  # cloudpickle always ships __main__ by value
    return [sys.modules[name] for name in sorted(names) if name in sys.modules]


def _closure_contents(function: Any) -> List[Any]:
    contents = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            contents.append(cell.cell_contents)
        except ValueError:  # a closure variable not assigned yet
            pass
    return contents


def _installed(module: ModuleType) -> bool:
    """Is ``module`` part of the standard library or of an installed distribution?"""
    top = module.__name__.partition(".")[0]
    return top in sys.stdlib_module_names or top in _distributed_packages()


@functools.lru_cache(maxsize=1)
def _distributed_packages() -> Set[str]:
    """Top-level names of every installed distribution (reading them all takes a while)."""
    return set(importlib.metadata.packages_distributions())


def _importable_by_name(module: ModuleType) -> bool:
    """Could a fresh interpreter with this sys.path import ``module`` under its name?"""
    name = module.__name__
    if name in sys.builtin_module_names:
        return True
    path = getattr(module, "__file__", None)
    if path is None:
        return False
    spec = _find_spec_afresh(name.partition(".")[0])
    if spec is None:
        return False
    roots = list(spec.submodule_search_locations or ([spec.origin] if spec.origin else []))
    path = os.path.realpath(path)
    return any(path.startswith(os.path.realpath(root)) for root in roots if root)


def _find_spec_afresh(name: str) -> Optional[ModuleSpec]:
    """Find a top-level module as a new interpreter would: ask the import system's finders
    (sys.path, and the meta-path finders of editable installs) without looking at sys.modules,
    which ``importlib.util.find_spec`` would answer from."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, None)
        except Exception:  # a third-party finder failing is "not found" for us
            continue
        if spec is not None:
            return spec
    return None
