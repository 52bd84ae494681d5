"""The environment config: one validated YAML file per environment drives the node pools, the
RayCluster and the jobs' defaults, so they cannot disagree.

Validation happens before anything is built or written. A bad file raises `ConfigError`, whose
message has one line per bad field, each naming the field and what would be valid.

Modules: `fields` (the field types and their help), `schema` (the models), `defaults` (what a field
left out becomes, derived from the catalog and the platform facts), `platform` (the platform's rules
over a whole environment), `errors` (ConfigError and pydantic's errors as lines); loading is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.config.errors import ConfigError, problems
from infra.config.platform import platform_problems
from infra.config.schema import (
    FLEX_CAPACITY,
    Autoscaling,
    BucketConfig,
    Capacity,
    CapacityKind,
    CpuPool,
    Environment,
    Network,
    Peer,
    RayAccess,
    RayConfig,
    RayHead,
    Reservation,
    Serving,
    SliceGroup,
)

__all__ = [
    "ENVIRONMENTS_DIR",
    "FLEX_CAPACITY",
    "Autoscaling",
    "BucketConfig",
    "Capacity",
    "CapacityKind",
    "ConfigError",
    "CpuPool",
    "Environment",
    "Network",
    "Peer",
    "RayAccess",
    "RayConfig",
    "RayHead",
    "Reservation",
    "Serving",
    "SliceGroup",
    "environment_names",
    "environment_path",
    "load_environment",
    "parse_environment",
    "platform_problems",
]

ENVIRONMENTS_DIR = Path(__file__).resolve().parent.parent / "environments"


def environment_names() -> list[str]:
    return sorted(p.stem for p in ENVIRONMENTS_DIR.glob("*.yaml"))


def environment_path(env: str | Path) -> Path:
    """An environment by name (`dev` -> infra/environments/dev.yaml) or by path."""
    path = Path(env)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(str(path), ["file not found"])
        return path
    candidate = ENVIRONMENTS_DIR / f"{env}.yaml"
    if not candidate.is_file():
        raise ConfigError(
            f"environment {str(env)!r}",
            [f"unknown environment; valid environments: {', '.join(environment_names()) or '(none)'}, or a path to a .yaml file"],
        )
    return candidate


def load_environment(env: str | Path) -> Environment:
    path = environment_path(env)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), [f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start} ({err.reason})"]) from None
    except OSError as err:
        raise ConfigError(str(path), [f"cannot read the file: {err.strerror or err}"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(str(path), [f"not valid YAML{where}: {getattr(err, 'problem', err)}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), ["expected a mapping of fields at the top level"])
    data.setdefault("name", path.stem)
    return parse_environment(data, source=str(path))


def parse_environment(data: dict[str, Any], source: str = "config") -> Environment:
    try:
        env = Environment.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, problems(err, Environment)) from None
    errors, _ = env.platform_findings
    if errors:
        raise ConfigError(source, errors)
    return env
