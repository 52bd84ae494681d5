"""The environment config: one validated YAML file per environment drives the node pools, the
RayCluster and the jobs' defaults, so they cannot disagree.

Validation happens before anything is built or written. A bad file raises `ConfigError`, whose
message has one line per bad field, each naming the field and what would be valid.

Modules: `fields` (the field types and their help), `schema` (the environment's model, and the
names of its sections' models: `network`, `slice_groups`, `ray`, `serving`, `kueue`), `platform`
(the platform's rules over a whole environment), `errors` (ConfigError and pydantic's errors as
lines); loading is here.
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
    KueueConfig,
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
    "KueueConfig",
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
    "with_images",
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


def with_images(data: dict[str, Any], tpu_image: str | None = None, serve_image: str | None = None) -> dict[str, Any]:
    """The config with the images a build produced in place of its own: `tpu_image` for every slice
    group's generation (`ray.tpu_images`), `serve_image` as `serving.image` (where there is a
    serving section). Validated like the rest, so a bad reference names its field."""
    out = dict(data)
    if tpu_image is not None:
        generations = [g.get("generation") for g in out.get("slice_groups") or [] if isinstance(g, dict)]
        ray = dict(out.get("ray") or {})
        ray["tpu_images"] = {**(ray.get("tpu_images") or {}), **{str(g): tpu_image for g in generations if g}}
        out["ray"] = ray
    if serve_image is not None and isinstance(out.get("serving"), dict):
        out["serving"] = {**out["serving"], "image": serve_image}
    return out


def load_environment(env: str | Path, *, tpu_image: str | None = None, serve_image: str | None = None) -> Environment:
    """An environment's validated config; `tpu_image` / `serve_image` override its images (with_images)."""
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
    return parse_environment(with_images(data, tpu_image, serve_image), source=str(path))


def parse_environment(data: dict[str, Any], source: str = "config") -> Environment:
    try:
        env = Environment.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, problems(err, Environment)) from None
    errors, _ = env.platform_findings
    if errors:
        raise ConfigError(source, errors)
    return env
