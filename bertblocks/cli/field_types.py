"""How a config or option field's type is shown to people: ``int > 0``, ``float in [0, 1]``, ``'a' | 'b' | null``.

Written by hand rather than with ``repr`` (``Optional[...]``, which also changes between Python versions);
shared by the ``components -v`` listing and the generated reference pages.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic.fields import FieldInfo

from bertblocks.config import ComponentSpec


def render_type(annotation: Any, metadata: list[Any] | None = None) -> str:
    """A short, stable rendering of a field's type: ``int > 0``, ``float in [0, 1]``, ``'a' | 'b' | null``."""
    text = _render(annotation)
    constraints = _constraints(metadata or [])
    return f"{text} {constraints}".strip()


def _render(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is typing.Annotated:
        base, *meta = args
        nested = [m for m in meta if not isinstance(m, FieldInfo)]
        for m in meta:
            if isinstance(m, FieldInfo):
                nested.extend(m.metadata)
        return render_type(base, nested)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_render(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (list, tuple, set):
        return f"{origin.__name__}[{', '.join(_render(a) for a in args)}]"
    if origin is dict:
        return f"map[{_render(args[0])}, {_render(args[1])}]"
    if isinstance(annotation, type):
        if issubclass(annotation, ComponentSpec):
            return "component"
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _constraints(metadata: list[Any]) -> str:
    bounds = {key: getattr(m, key) for m in metadata for key in ("gt", "ge", "lt", "le") if hasattr(m, key)}
    lo, hi = bounds.get("ge", bounds.get("gt")), bounds.get("le", bounds.get("lt"))
    if lo is not None and hi is not None:
        left = "[" if "ge" in bounds else "("
        right = "]" if "le" in bounds else ")"
        return f"in {left}{_num(lo)}, {_num(hi)}{right}"
    if lo is not None:
        return f"{'≥' if 'ge' in bounds else '>'} {_num(lo)}"
    if hi is not None:
        return f"{'≤' if 'le' in bounds else '<'} {_num(hi)}"
    return ""


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
