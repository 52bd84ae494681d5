"""Config errors: `ConfigError` (one line per bad field) and the translation of pydantic's
validation errors into such lines, each naming the field and what would be valid."""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from infra.config.fields import PATTERN_HELP


class ConfigError(ValueError):
    """An invalid environment config. `str()` is the whole user-facing message."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source} is not a valid environment config:\n{lines}")


def problems(err: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per problem in `err` (from validating `root`), naming the field."""
    problems: list[str] = []
    for e in err.errors():
        loc = _dotted(e["loc"])
        if e["type"] == "extra_forbidden":
            valid = _valid_fields(root, e["loc"][:-1])
            msg = f"unknown field; valid fields here: {', '.join(valid)}" if valid else "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        else:
            msg = re.sub(r"^(Value error|Assertion failed), ", "", e["msg"])
            if e["type"] == "string_pattern_mismatch":
                pattern = e.get("ctx", {}).get("pattern", "")
                msg = f"{e['input']!r} is not valid: expected {PATTERN_HELP.get(pattern, f'text matching {pattern}')}"
        line = f"{loc}: {msg}" if loc else msg
        problems.append(line.replace("\r", "\\r").replace("\n", "\\n"))  # one line per problem
    # A union (capacity) reports every branch; keep one line per field.
    return list(dict.fromkeys(problems))


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not re.fullmatch(r"[A-Za-z0-9_-]+", str(part)):
            out += f"[{str(part)!r}]"  # a key with spaces or control characters, shown as typed
        else:
            out += f".{part}" if out else str(part)
    return out


def _valid_fields(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model at `loc`, for "unknown field" messages."""
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            if isinstance(model, type) and issubclass(model, BaseModel):
                continue
            return []
        model = _model_in(field.annotation)
        if model is None:
            return []
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [n for n in model.model_fields]
    return []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType, list, Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found:
                return found
    return None
