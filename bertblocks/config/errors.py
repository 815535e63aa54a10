"""Config errors: every problem found, each with its dotted location, reported at once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import BertBlocksError, did_you_mean


# ------------------------------------------------------------------------------------------------ errors
@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config: where (dotted path) and what."""

    loc: str
    msg: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.msg}" if self.loc else self.msg


class ConfigError(BertBlocksError, ValueError):
    """A config that cannot be built. ``issues`` lists every problem found, each with its dotted path."""

    def __init__(self, issues: Iterable[ConfigIssue], source: str | None = None) -> None:
        self.issues = list(issues)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        n = len(self.issues)
        super().__init__(f"invalid config{where} ({n} error{'s' if n != 1 else ''}):\n{lines}")


class ConfigFileNotFoundError(BertBlocksError, FileNotFoundError):
    """A config path (file, or checkpoint directory without ``config.json``) that does not exist."""


class FieldError(BertBlocksError, ValueError):
    """Raised by a cross-field validator to blame one field: pydantic gives such errors no location."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(msg)
        self.loc = loc


def join_loc(*parts: Any) -> str:
    return ".".join(str(p) for p in parts if p != "")


#: pydantic's error types of a value of the wrong type, for which the message names the value given
_STRICT_TYPES = frozenset({"int_type", "float_type", "bool_type", "string_type"})


def issues_from_validation_error(
    error: ValidationError,
    prefix: str = "",
    model: type[BaseModel] | None = None,
    known_fields: Iterable[str] | None = None,
) -> list[ConfigIssue]:
    """Turn pydantic's errors into located issues; unknown keys get the allowed ones and a "did you mean".

    ``known_fields`` replaces the field names looked up in ``model`` (for plugin options, whose allowed keys
    are the spec's typed fields plus the plugin's own).
    """
    issues = []
    for err in error.errors(include_url=False):
        loc = list(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            loc, msg = [*loc, cause.loc], str(cause)
        if err["type"] in _STRICT_TYPES and "input" in err:
            # the config's scalars are strict (true is no count): say what was given instead
            msg += f", got {err['input']!r} (a {type(err['input']).__name__})"
        if err["type"] == "extra_forbidden" and (model is not None or known_fields is not None):
            allowed = list(known_fields) if known_fields is not None else _fields_at(model, loc[:-1])  # type: ignore[arg-type]
            msg = f"unknown field; allowed fields: {', '.join(sorted(allowed))}" + did_you_mean(str(loc[-1]), allowed)
        issues.append(ConfigIssue(join_loc(prefix, *loc), msg))
    return issues


def _fields_at(model: type[BaseModel], loc: list[Any]) -> list[str]:
    """Field names of the (nested) model found at ``loc`` inside ``model``; best effort."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        candidates = [annotation, *args]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))
