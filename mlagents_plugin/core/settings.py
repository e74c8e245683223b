"""The ``env_manager:`` section of an ML-Agents trainer YAML.

Settings are attrs classes, as ML-Agents' own are. The section is validated strictly: an
unknown key or a wrong type stops ``mlagents-learn`` before anything starts, with a message
naming the key and the valid ones. See docs/configuration.md for every setting and its why.
"""
import ipaddress
import math
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import attr
import yaml
from mlagents.trainers.exception import TrainerConfigError
from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core import platform

SECTION = "env_manager"
EFFECTIVE_SETTINGS_FILE = "env_manager.yaml"
START_METHODS = ("forkserver", "spawn", "fork")
LISTEN_CHOICES = ("loopback", "all")
BACKENDS = ("subprocess", "ray")
SCHEDULING_STRATEGIES = ("SPREAD", "DEFAULT")
# Added to --timeout-wait for the derived deadlines; starting also pays for a new interpreter.
STEP_MARGIN_S = 10.0
STARTUP_MARGIN_S = 30.0
# The longest any duration may be. Every wait is bounded, and a bound must be one: .inf or 1e12
# would pass a "> 0" check and then overflow the first timer it reaches.
MAX_DURATION_S = 24 * 3600.0
# Envs one Ray actor may host: each is a process (a Unity build with its own port).
MAX_ENVS_PER_WORKER = 256


class SettingError(ValueError):
    """One setting's value refused, in words: ``expected ..., got ...``."""

    def __init__(self, name: str, text: str):
        super().__init__(f"{name}: {text}")
        self.name, self.text = name, text


class ConfigError(TrainerConfigError):
    """The ``env_manager:`` section (or what it names) cannot work; ``mlagents-learn`` shows the
    message as one line, and the traceback only under ``--debug`` (compat.install_config_errors)."""


Validator = Callable[[Any, "attr.Attribute", Any], None]


def _expect(expected: str, ok: Callable[[Any], bool], optional: bool = False) -> Validator:
    """A validator refusing what ``ok`` refuses with "expected <expected>, got <value>"."""

    def validate(instance: Any, attribute: "attr.Attribute", value: Any) -> None:
        if not (optional and value is None) and not ok(value):
            raise SettingError(attribute.name, f"expected {expected}, got {value!r}")

    return validate


def _float(value: Any) -> Any:
    """YAML reads ``5`` as an int; accept it for a float setting (but not a bool)."""
    return float(value) if type(value) is int else value


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _seconds(value: Any, minimum_excluded: bool) -> bool:
    return _number(value) and (value > 0 if minimum_excluded else value >= 0) and value <= MAX_DURATION_S


_DURATION = f"at most {MAX_DURATION_S:.0f} (one day)"
_timeout: Dict[str, Any] = dict(
    converter=_float, validator=_expect(f"a number of seconds above 0, {_DURATION}", lambda v: _seconds(v, True))
)
_optional_timeout: Dict[str, Any] = dict(
    default=None,
    converter=attr.converters.optional(_float),
    validator=_expect(
        f"a number of seconds above 0, {_DURATION}", lambda v: _seconds(v, True), optional=True
    ),
)
_flag = _expect("true or false", lambda v: isinstance(v, bool))


def _one_of(choices: Tuple[str, ...]) -> Validator:
    return _expect(f"one of {', '.join(choices)}", lambda v: isinstance(v, str) and v in choices)


# What Ray's actor options refuse in ``resources`` (ray/_common/utils.py, Ray 2.60).
RAY_RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory", "bundle")


@attr.s(auto_attribs=True, frozen=True)
class RaySettings:
    """``env_manager.ray``: where and how env workers run as Ray actors (docs/ray.md)."""

    # An existing cluster ("ray://host:10001", "auto", "host:6379"); None starts a one-node Ray
    # on loopback for this run (or uses the Ray this process is already connected to).
    address: Optional[str] = attr.ib(
        default=None, validator=_expect("an address (a string)", lambda v: isinstance(v, str), optional=True)
    )
    num_cpus_per_worker: float = attr.ib(
        default=1.0,
        converter=_float,
        validator=_expect("a number, 0 or more", lambda v: _number(v) and v >= 0),
    )
    # Custom resources only: Ray refuses its own here (num_cpus_per_worker asks for CPUs).
    resources: Dict[str, float] = attr.ib(
        factory=dict,
        validator=_expect(
            "a mapping of custom resource names to numbers (not Ray's own: "
            + ", ".join(RAY_RESERVED_RESOURCES) + "; num_cpus_per_worker asks for CPUs)",
            lambda v: isinstance(v, dict)
            and all(isinstance(k, str) and k not in RAY_RESERVED_RESOURCES and _number(n) for k, n in v.items()),
        ),
    )
    runtime_env: Optional[Dict[str, Any]] = attr.ib(
        default=None, validator=_expect("a mapping (Ray's runtime_env)", lambda v: isinstance(v, dict), optional=True)
    )
    # SPREAD puts env workers on different nodes where it can: Unity builds are heavy.
    scheduling_strategy: str = attr.ib(
        default="SPREAD", validator=_one_of(SCHEDULING_STRATEGIES)
    )


def _ray_settings(value: Any) -> RaySettings:
    if isinstance(value, RaySettings):
        return value
    if value is None:
        return RaySettings()
    return _build(RaySettings, value, f"{SECTION}.ray")


def _build(cls: type, section: Any, where: str) -> Any:
    """``cls(**section)``, refusing anything but a mapping of known keys, in one line of words:
    ``env_manager.step_timeout_s: expected a number of seconds ..., got 'abc'``."""
    valid = [f.name for f in attr.fields(cls)]
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings ({', '.join(valid)}), got {section!r}")
    unknown = sorted(str(key) for key in section if key not in valid)
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting '{unknown[0]}'; the settings are {', '.join(valid)} "
            "(docs/configuration.md)"
        )
    try:
        return cls(**section)
    except SettingError as e:
        raise ConfigError(f"{where}.{e.name}: {e.text}") from None
    except ValueError as e:  # a combination that cannot work (__attrs_post_init__)
        raise ConfigError(f"{where}: {e}") from None


def _names_factory(value: str) -> bool:
    module, _, factory = value.partition(":")
    return bool(module and factory and ":" not in factory)


def _start_method(instance: Any, attribute: "attr.Attribute", value: Optional[str]) -> None:
    if value is None:
        return
    _one_of(START_METHODS)(instance, attribute, value)
    if value not in platform.start_methods():
        raise SettingError(
            attribute.name,
            f"{value} is not available on {sys.platform}, which has {', '.join(platform.start_methods())}",
        )


def _loopback_by_name(value: Any) -> Any:
    """``localhost`` is what ``loopback`` binds (127.0.0.1, and ::1 where the machine has it)."""
    return "loopback" if isinstance(value, str) and value.lower() == "localhost" else value


def _listen_address(value: Any) -> bool:
    if value in LISTEN_CHOICES:
        return True
    try:
        return not ipaddress.ip_address(value).is_unspecified  # 0.0.0.0 and :: are "all"
    except ValueError:
        return False


@attr.s(auto_attribs=True, frozen=True)
class EnvManagerSettings:
    enabled: bool = attr.ib(default=True, validator=_flag)
    backend: str = attr.ib(default="subprocess", validator=_one_of(BACKENDS))
    # None: forkserver with the Linux hardening, spawn on the portable path (core/platform.py)
    start_method: Optional[str] = attr.ib(default=None, validator=_start_method)
    shutdown_timeout_s: float = attr.ib(default=10.0, **_timeout)
    kill_grace_s: float = attr.ib(default=2.0, **_timeout)
    startup_timeout_s: Optional[float] = attr.ib(**_optional_timeout)
    step_timeout_s: Optional[float] = attr.ib(**_optional_timeout)
    restart_on: List[str] = attr.ib(
        factory=list,
        validator=_expect(
            "a list of exception names", lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v)
        ),
    )
    restart_backoff_s: float = attr.ib(
        default=1.0,
        converter=_float,
        validator=_expect(f"a number of seconds, 0 or more, {_DURATION}", lambda v: _seconds(v, False)),
    )
    env: Optional[str] = attr.ib(
        default=None,
        validator=_expect(
            "'package.module:factory'", lambda v: isinstance(v, str) and _names_factory(v), optional=True
        ),
    )
    env_kwargs: Dict[str, Any] = attr.ib(
        factory=dict, validator=_expect("a mapping of keyword arguments", lambda v: isinstance(v, dict))
    )
    ray: RaySettings = attr.ib(factory=RaySettings, converter=_ray_settings)
    # one forward pass per behaviour for all workers ready together (NOTE [ Batched inference ])
    batch_inference: bool = attr.ib(default=True, validator=_flag)
    # a worker's next actions are sent as soon as its step lands (NOTE [ Actions as steps land ])
    early_actions: bool = attr.ib(default=True, validator=_flag)
    # where each worker's gRPC server for its Unity build listens (NOTE [ Loopback only ] in
    # local/rpc_server.py): loopback, all (as mlagents-envs), or loopback and one address
    listen: str = attr.ib(
        default="loopback",
        converter=_loopback_by_name,
        validator=_expect(
            "loopback (or localhost), all (every address), or one IP address of this machine (an "
            "address: a host name is not looked up)",
            lambda v: isinstance(v, str) and _listen_address(v),
        ),
    )
    # envs one Ray actor hosts and steps together, each its own process (NOTE [ Hosts ] in
    # ray/backend.py)
    envs_per_worker: int = attr.ib(
        default=1,
        validator=_expect(
            f"a whole number from 1 to {MAX_ENVS_PER_WORKER}",
            lambda v: type(v) is int and 1 <= v <= MAX_ENVS_PER_WORKER,
        ),
    )

    def __attrs_post_init__(self) -> None:
        """Combinations that cannot work are refused, not ignored."""
        if self.env_kwargs and self.env is None:
            raise ValueError("'env_kwargs' is set but 'env' is not: name the env they are for.")
        if not self.enabled and self.env is not None:
            raise ValueError(
                "'env' needs the plugin, but 'enabled' is false: ML-Agents' own "
                "SubprocessEnvManager trains only on Unity builds and the Editor."
            )
        if self.envs_per_worker > 1 and self.backend != "ray":
            raise ValueError(
                f"'envs_per_worker: {self.envs_per_worker}' is for the Ray backend, where it "
                "divides the trainer's cost of an actor call; with the subprocess backend every "
                "env is its own process on a pipe already (docs/ray.md, Sizing)."
            )
        if not self.enabled and self.backend != "subprocess":
            raise ValueError(
                f"'backend: {self.backend}' needs the plugin, but 'enabled' is false."
            )

    def ignored_when_disabled(self) -> List[str]:
        """The settings that differ from their defaults and mean nothing with enabled: false."""
        defaults = EnvManagerSettings().as_dict()
        return [name for name, value in self.as_dict().items() if name != "enabled" and value != defaults[name]]

    def resolved(self, run_options: RunOptions) -> "EnvManagerSettings":
        """The settings with every derived default filled in from ``run_options``.

        mlagents-envs gives up on a Unity build after ``--timeout-wait`` seconds with a
        UnityTimeOutException, the better message; our deadlines leave it time to do so.
        """
        return self.resolved_for(run_options.env_settings.timeout_wait)

    def resolved_for(self, timeout_wait: float) -> "EnvManagerSettings":
        """``resolved``, from ``--timeout-wait`` alone (checked before the run folder exists)."""
        try:
            return attr.evolve(
                self,
                start_method=self.start_method or platform.default_start_method(),
                startup_timeout_s=self.startup_timeout_s or timeout_wait + STARTUP_MARGIN_S,
                step_timeout_s=self.step_timeout_s or timeout_wait + STEP_MARGIN_S,
            )
        except ValueError as e:
            raise ConfigError(
                f"--timeout-wait={timeout_wait} is too long for the deadlines derived from it: "
                f"{e.args[0]}. Set env_manager.startup_timeout_s and step_timeout_s, or a shorter "
                "--timeout-wait."
            ) from None

    def as_dict(self) -> Dict[str, Any]:
        return attr.asdict(self)


def parse_section(section: Any) -> EnvManagerSettings:
    """Validate the YAML's ``env_manager:`` section; raise TrainerConfigError if it is wrong."""
    if section is None:
        return EnvManagerSettings()
    return _build(EnvManagerSettings, section, SECTION)


def write_effective_settings(
    settings: EnvManagerSettings, run_options: RunOptions, manager_name: str
) -> Optional[str]:
    """Write the settings in force beside ML-Agents' configuration.yaml; return the path."""
    folder = run_options.checkpoint_settings.write_path
    if not os.path.isdir(folder):
        return None
    path = os.path.join(folder, EFFECTIVE_SETTINGS_FILE)
    with open(path, "w") as f:
        yaml.safe_dump({"manager": manager_name, SECTION: settings.as_dict()}, f, sort_keys=False)
    return path
