"""Names of other projects' internals that the package depends on, and their check.

ML-Agents' (integration/compat.py), Python's multiprocessing and logging (local/fork_server.py) and
Ray's (ray/local.py) are each listed as ``Internal`` entries; ``verify`` says which of them the
installed versions no longer have. The doctor and the test suite run the three lists, so that an
upgrade fails there, loudly.
"""
import importlib
import inspect
from typing import Any, List, NamedTuple, Sequence


class Internal(NamedTuple):
    """A name another project does not promise to keep, and what must hold of it."""

    name: str  # "module:attribute.attribute"
    use: str  # how the package uses it
    source_mentions: str = ""  # text its source must contain (the call we rely on)


ORIGINAL = "_mlagents_plugin_original"  # on a wrapper of ours: the function it wraps


def original(function: Any) -> Any:
    """The other project's own function, under any wrapper of ours."""
    return getattr(function, ORIGINAL, function)


def verify(internals: Sequence[Internal]) -> List[str]:
    """One line for each internal that is missing or no longer does what we rely on."""
    problems = []
    for internal in internals:
        module_name, _, path = internal.name.partition(":")
        try:
            target: Any = importlib.import_module(module_name)
            for part in path.split("."):
                target = inspect.getattr_static(target, part)
            target = _undecorated(original(getattr(target, "__func__", target)), path.rpartition(".")[2])
            if internal.source_mentions and internal.source_mentions not in inspect.getsource(target):
                problems.append(f"{internal.name} no longer mentions {internal.source_mentions!r}")
        except (ImportError, AttributeError) as e:
            problems.append(f"{internal.name} is missing ({e})")
        except (OSError, TypeError) as e:
            problems.append(f"{internal.name}: its source cannot be read ({e})")
    return problems


def _undecorated(function: Any, name: str) -> Any:
    """``function``, or the function ``name`` its wrapper holds in its closure: mlagents-envs'
    ``@timed`` wraps without ``functools.wraps``, and the wrapper's source is not the method's."""
    if not inspect.isfunction(function) or function.__name__ == name:
        return function
    held = inspect.getclosurevars(function).nonlocals.values()
    return next((f for f in held if inspect.isfunction(f) and f.__name__ == name), function)
