"""Serve mlagents-envs 1.1.0's generated protobuf modules from a modern protobuf.

# NOTE [ Fast protobuf ]
# mlagents-envs 1.1.0 ships ``communicator_objects/*_pb2.py`` written by an old protoc; they load
# only with protobuf < 3.21, and on Python 3.11 that protobuf runs in pure Python: decoding one
# 32-agent UnityOutput costs milliseconds, most of a step's trainer time. Every generated module
# embeds its serialized FileDescriptorProto. A finder on ``sys.meta_path`` intercepts the imports
# of ``mlagents_envs.communicator_objects.*_pb2``, reads that descriptor out of the file with
# ``ast`` (the old code never runs: it raises under protobuf >= 4), adds it to protobuf's default
# descriptor pool and builds the module from it with the public ``message_factory`` API: the
# same names (messages, nested messages, enum wrappers, enum values as constants, DESCRIPTOR),
# classes from the upb C backend, byte-identical on the wire. Classes get the module and
# qualified name of the original, so instances pickle by reference (mlagents-envs pickles every
# message through a pipe between its gRPC thread and its main thread).
#
# The finder must be in place before anything imports mlagents-envs, in the trainer, in every
# worker (spawn starts fresh interpreters, and so does forkserver, unless its server is a fork
# of the trainer, which has the finder already) and in the player. The one place that
# runs that early in every interpreter is a ``.pth`` file in site-packages, which calls
# ``install()``: the wheel carries it, and ``make install`` writes it for the editable checkout.
# Loading this module costs nothing: protobuf is imported at the first intercepted import, and
# with protobuf < 4 (Python 3.10's) the finder steps aside and the original files load.
"""
import sys
from typing import Any, Dict, List, Optional, Tuple, cast

PACKAGE = "mlagents_envs.communicator_objects"
PTH_NAME = "mlagents_plugin_fast_protobuf.pth"
# The .pth finds this file through the import system, without importing the package, and loads
# it under a private name: importing the package from a .pth would make pytest warn, in every
# project with this package installed, that it cannot rewrite the asserts of our pytest plugin.
# Finders are recognised across the two copies by FINDER_MARK. The wheel ships the .pth (setup.py);
# an editable install writes it with ``python -m mlagents_plugin.fast_protobuf --install-pth``.
PTH_LINE = (
    "import importlib.util as u, os; p = u.find_spec('mlagents_plugin'); "
    "s = p and u.spec_from_file_location('_mlagents_plugin_fast_protobuf', "
    "os.path.join(p.submodule_search_locations[0], 'fast_protobuf.py')); "
    "m = s and u.module_from_spec(s); s and s.loader.exec_module(m); m and m.install()\n"
)
FINDER_MARK = "_mlagents_plugin_fast_protobuf"


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(getattr(finder, FINDER_MARK, False) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def needed() -> bool:
    """Whether mlagents-envs' generated modules need the finder: protobuf 4 or newer."""
    import google.protobuf

    return int(google.protobuf.__version__.split(".")[0]) >= 4


def backend() -> str:
    """'upb' (fast) or 'python' (slow): what protobuf decodes with in this process."""
    from google.protobuf.internal import api_implementation

    return api_implementation.Type()


def slow_backend_warning() -> Optional[str]:
    """A message for the user if messages to and from Unity decode in pure Python."""
    if backend() != "python":
        return None
    import google.protobuf

    return (
        f"protobuf {google.protobuf.__version__} decodes in pure Python: every Unity step costs "
        "milliseconds of trainer CPU (about 15x more than the upb backend with 32 agents). Install "
        "a modern protobuf with this package's recipe (`make install`, see docs/install.md)."
    )


def served_modules() -> List[str]:
    """The pb2 modules that were built by the finder (for the doctor and tests)."""
    return sorted(
        name for name, module in list(sys.modules.items()) if vars(module).get("__fast_protobuf__", False)
    )


class _Finder:
    _mlagents_plugin_fast_protobuf = True  # FINDER_MARK

    def __init__(self) -> None:
        self._needed: Optional[bool] = None  # decided at the first import: protobuf loads then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not (fullname.startswith(PACKAGE + ".") and fullname.endswith("_pb2")):
            return None
        if self._needed is None:
            self._needed = needed()
        if not self._needed:
            return None
        import importlib.machinery
        import importlib.util

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin:
            return None
        loader = cast(Any, _Loader(spec.origin))  # typeshed wants the legacy load_module, never called
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=loader)


class _Loader:
    def __init__(self, origin: str):
        self.origin = origin

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        import ast

        with open(self.origin, "rb") as f:
            tree = ast.parse(f.read(), self.origin)
        serialized, imports = _descriptor_and_imports(tree, self.origin)
        namespace = module.__dict__
        # The file's own imports: its sibling modules (so dependencies are in the pool first)
        # and the aliases mlagents-envs' gRPC module refers to.
        for statement in imports:
            code = compile(ast.Module(body=[statement], type_ignores=[]), self.origin, "exec")
            try:
                exec(code, namespace)
            except ImportError:
                if not _imports_google_protobuf(statement):
                    raise  # a google.protobuf module a newer protobuf dropped is not needed
        _build(namespace, module.__name__, serialized)
        namespace["__fast_protobuf__"] = True


def _descriptor_and_imports(tree: Any, filename: str) -> Tuple[bytes, List[Any]]:
    """The serialized FileDescriptorProto (``FileDescriptor(serialized_pb=...)`` in old
    generated code, ``AddSerializedFile(b'...')`` in newer), and the top-level imports."""
    import ast

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        literal = None
        if name == "FileDescriptor":
            literal = next((kw.value for kw in node.keywords if kw.arg == "serialized_pb"), None)
        elif name == "AddSerializedFile" and node.args:
            literal = node.args[0]
        if literal is not None:
            if isinstance(literal, ast.Call) and literal.args:  # old code wraps it: _b('...')
                literal = literal.args[0]
            value = ast.literal_eval(literal)
            serialized = value if isinstance(value, bytes) else value.encode("latin1")
            imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            return serialized, imports
    raise ImportError(f"no serialized FileDescriptorProto in {filename}")


def _imports_google_protobuf(statement: Any) -> bool:
    module = getattr(statement, "module", None) or ""
    return module.startswith("google.protobuf") or all(
        alias.name.startswith("google.protobuf") for alias in statement.names
    )


def _build(namespace: Dict[str, Any], module_name: str, serialized: bytes) -> None:
    """Fill a module namespace as protoc's generated code would."""
    from google.protobuf import descriptor_pool, message_factory, symbol_database
    from google.protobuf.internal import enum_type_wrapper

    pool = descriptor_pool.Default()
    file = pool.AddSerializedFile(serialized)
    database = symbol_database.Default()
    namespace["DESCRIPTOR"] = file
    namespace["_sym_db"] = database

    def add_enum(enum: Any, put: Any, prefix: str) -> None:
        namespace[prefix + enum.name.upper()] = enum
        put(enum.name, enum_type_wrapper.EnumTypeWrapper(enum))
        for value in enum.values:
            put(value.name, value.number)

    def add_message(descriptor: Any, qualname: str, prefix: str) -> Any:
        cls = message_factory.GetMessageClass(descriptor)
        # As built, the classes have no usable __module__, so pickle could not find them.
        cls.__module__, cls.__qualname__ = module_name, qualname
        database.RegisterMessage(cls)  # nested instances unpickle through the symbol database
        namespace[prefix] = descriptor
        for nested in descriptor.nested_types:
            setattr(
                cls, nested.name, add_message(nested, f"{qualname}.{nested.name}", f"{prefix}_{nested.name.upper()}")
            )
        for enum in descriptor.enum_types:
            add_enum(enum, lambda name, value, c=cls: setattr(c, name, value), f"{prefix}_")
        return cls

    for enum in file.enum_types_by_name.values():
        add_enum(enum, namespace.__setitem__, "_")
    for name, service in file.services_by_name.items():
        namespace["_" + name.upper()] = service
    for name, descriptor in file.message_types_by_name.items():
        namespace[name] = add_message(descriptor, name, "_" + name.upper())


def install_pth() -> str:
    """Write the .pth file that installs the finder in every interpreter of this environment."""
    import os
    import sysconfig

    path = os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


if __name__ == "__main__":
    if sys.argv[1:] != ["--install-pth"]:
        sys.exit("usage: python -m mlagents_plugin.fast_protobuf --install-pth")
    print(install_pth())
