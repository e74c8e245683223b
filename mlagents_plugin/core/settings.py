"""The ``env_manager:`` section of an ML-Agents trainer YAML.

Settings are attrs classes, as ML-Agents' own are. The section is validated strictly: an
unknown key or a wrong type stops ``mlagents-learn`` before anything starts, with a message
naming the key and the valid ones. See docs/configuration.md for every setting and its why.
"""
import math
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

import attr
import yaml
from mlagents.trainers.exception import TrainerConfigError
from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core import platform

SECTION = "env_manager"
EFFECTIVE_SETTINGS_FILE = "env_manager.yaml"
START_METHODS = ("forkserver", "spawn", "fork")
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


def _float(value: Any) -> Any:
    """YAML reads ``5`` as an int; accept it for a float setting (but not a bool)."""
    return float(value) if type(value) is int else value


def _positive(instance: Any, attribute: "attr.Attribute", value: Optional[float]) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"'{attribute.name}' must be > 0 (got {value!r}).")


def _bounded(instance: Any, attribute: "attr.Attribute", value: Optional[float]) -> None:
    if value is not None and not (math.isfinite(value) and value <= MAX_DURATION_S):
        raise ValueError(
            f"'{attribute.name}' must be a finite number of seconds, at most {MAX_DURATION_S:.0f} "
            f"(one day) (got {value!r})."
        )


def _finite(instance: Any, attribute: "attr.Attribute", value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{attribute.name}' must be a finite number (got {value!r}).")


_timeout: Dict[str, Any] = dict(converter=_float, validator=[attr.validators.instance_of(float), _bounded, _positive])
_optional_timeout: Dict[str, Any] = dict(
    default=None,
    converter=attr.converters.optional(_float),
    validator=[attr.validators.optional(attr.validators.instance_of(float)), _bounded, _positive],
)


@attr.s(auto_attribs=True, frozen=True)
class RaySettings:
    """``env_manager.ray``: where and how env workers run as Ray actors (docs/ray.md)."""

    # An existing cluster ("ray://host:10001", "auto", "host:6379"); None starts a one-node Ray
    # on loopback for this run (or uses the Ray this process is already connected to).
    address: Optional[str] = attr.ib(
        default=None, validator=attr.validators.optional(attr.validators.instance_of(str))
    )
    num_cpus_per_worker: float = attr.ib(
        default=1.0,
        converter=_float,
        validator=[attr.validators.instance_of(float), _finite, attr.validators.ge(0.0)],
    )
    resources: Dict[str, float] = attr.ib(
        factory=dict,
        validator=attr.validators.deep_mapping(
            attr.validators.instance_of(str),
            attr.validators.instance_of((int, float)),
            attr.validators.instance_of(dict),
        ),
    )
    runtime_env: Optional[Dict[str, Any]] = attr.ib(
        default=None, validator=attr.validators.optional(attr.validators.instance_of(dict))
    )
    # SPREAD puts env workers on different nodes where it can: Unity builds are heavy.
    scheduling_strategy: str = attr.ib(
        default="SPREAD", validator=attr.validators.in_(SCHEDULING_STRATEGIES)
    )


def _ray_settings(value: Any) -> RaySettings:
    if isinstance(value, RaySettings):
        return value
    if value is None:
        return RaySettings()
    return _build(RaySettings, value, f"{SECTION}.ray")


def _build(cls: type, section: Any, where: str) -> Any:
    """``cls(**section)``, refusing anything but a mapping of known keys, in words."""
    valid = [f.name for f in attr.fields(cls)]
    if not isinstance(section, Mapping):
        raise TrainerConfigError(
            f"The '{where}' section must be a mapping of settings ({', '.join(valid)}), "
            f"but it is {section!r}."
        )
    unknown = sorted(str(key) for key in section if key not in valid)
    if unknown:
        raise TrainerConfigError(
            f"Unknown setting '{unknown[0]}' in the '{where}' section of your YAML file. "
            f"Valid settings are: {', '.join(valid)}. See docs/configuration.md."
        )
    try:
        return cls(**section)
    except (TypeError, ValueError) as e:
        reason = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)  # attrs adds more args
        raise TrainerConfigError(
            f"Invalid '{where}' setting in your YAML file: {reason} See docs/configuration.md."
        ) from None


def _start_method(instance: Any, attribute: "attr.Attribute", value: Optional[str]) -> None:
    if value is None:
        return
    if value not in START_METHODS:
        raise ValueError(f"'{attribute.name}' must be one of {', '.join(START_METHODS)} (got {value!r}).")
    if value not in platform.start_methods():
        raise ValueError(
            f"'{attribute.name}: {value}' is not available on {sys.platform}, which has "
            f"{', '.join(platform.start_methods())}."
        )


def _count(instance: Any, attribute: "attr.Attribute", value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"'{attribute.name}' must be a whole number, not {value!r}.")


@attr.s(auto_attribs=True, frozen=True)
class EnvManagerSettings:
    enabled: bool = attr.ib(default=True, validator=attr.validators.instance_of(bool))
    backend: str = attr.ib(default="subprocess", validator=attr.validators.in_(BACKENDS))
    # None: forkserver with the Linux hardening, spawn on the portable path (core/platform.py)
    start_method: Optional[str] = attr.ib(default=None, validator=_start_method)
    shutdown_timeout_s: float = attr.ib(default=10.0, **_timeout)
    kill_grace_s: float = attr.ib(default=2.0, **_timeout)
    startup_timeout_s: Optional[float] = attr.ib(**_optional_timeout)
    step_timeout_s: Optional[float] = attr.ib(**_optional_timeout)
    restart_on: List[str] = attr.ib(
        factory=list,
        validator=attr.validators.deep_iterable(
            attr.validators.instance_of(str), attr.validators.instance_of(list)
        ),
    )
    restart_backoff_s: float = attr.ib(
        default=1.0,
        converter=_float,
        validator=[attr.validators.instance_of(float), _bounded, attr.validators.ge(0.0)],
    )
    env: Optional[str] = attr.ib(
        default=None, validator=attr.validators.optional(attr.validators.instance_of(str))
    )
    env_kwargs: Dict[str, Any] = attr.ib(
        factory=dict, validator=attr.validators.instance_of(dict)
    )
    ray: RaySettings = attr.ib(factory=RaySettings, converter=_ray_settings)
    # one forward pass per behaviour for all workers ready together (NOTE [ Batched inference ])
    batch_inference: bool = attr.ib(default=True, validator=attr.validators.instance_of(bool))
    # envs one Ray actor hosts and steps together, each its own process (NOTE [ Hosts ] in
    # ray/backend.py)
    envs_per_worker: int = attr.ib(
        default=1,
        validator=[_count, attr.validators.ge(1), attr.validators.le(MAX_ENVS_PER_WORKER)],
    )

    @env.validator
    def _check_env(self, attribute: "attr.Attribute", value: Optional[str]) -> None:
        module, _, factory = (value or "").partition(":")
        if value is not None and not (module and factory and ":" not in factory):
            raise ValueError(
                f"'env' must look like 'package.module:factory' (got {value!r})."
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
        timeout_wait = float(run_options.env_settings.timeout_wait)
        try:
            return attr.evolve(
                self,
                start_method=self.start_method or platform.default_start_method(),
                startup_timeout_s=self.startup_timeout_s or timeout_wait + STARTUP_MARGIN_S,
                step_timeout_s=self.step_timeout_s or timeout_wait + STEP_MARGIN_S,
            )
        except ValueError as e:
            raise TrainerConfigError(
                f"--timeout-wait={run_options.env_settings.timeout_wait} is too long for the "
                f"deadlines derived from it: {e.args[0]} Set env_manager.startup_timeout_s and "
                "step_timeout_s, or a shorter --timeout-wait."
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
