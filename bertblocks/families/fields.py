"""The typed declaration of a family's ``config.json`` fields: what each field may hold, checked in one place.

A family (:class:`~bertblocks.families.family.Family`) declares, in ``Family.fields``, every ``config.json`` field
its ``config_from_hf`` reads, each an :class:`HFField` (a JSON type, a range, whether ``null`` is allowed, the values
a string may take). The one translator (:func:`bertblocks.hf.config_json.config_from_hf`) checks a file against
the declaration *before* the family sees it, so that a family's code never meets a value of the wrong type: the
string ``"false"`` is refused where a boolean is declared (it would be ``True`` to ``bool()``), ``1.5`` or ``true``
where an integer is, ``-1`` where a size is. Each refusal names the field. The same declaration gives "did you
mean" for a misspelt key, and the fuzz test (``tests/families/test_field_fuzz.py``) walks every registered family,
third-party ones included, and tries wrong values on every declared field.

A field the family reads but does not declare is a bug of the family: the translator warns
(:class:`UndeclaredFieldWarning`) whenever a ``config.json`` holds it ("reads" meaning the field is not handed back in
the translation's ``hf`` passthrough), and the fuzz test fails on it.

Example:
    >>> FIELDS = {"rotary_value": HFField(bool), "conv_kernel_size": HFField(int, ge=0)}
    >>> str(field_issues(FIELDS, {"rotary_value": "false"})[0])
    "rotary_value: rotary_value='false' is not supported: it must be a boolean (true or false), got the str 'false'"
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bertblocks.config import ConfigIssue

__all__ = ["INERT_FIELDS", "SHARED_FIELDS", "HFField", "UndeclaredFieldWarning", "field_issues", "undeclared", "unread"]

#: fields of every ``config.json`` the translator itself reads (a family may read them too without declaring them)
SHARED_FIELDS = frozenset({"model_type", "architectures", "auto_map", "bertblocks"})
#: transformers' own bookkeeping, written by every ``PretrainedConfig`` whatever the model: token ids used only
#: to generate or to tokenize, dtypes, output switches a caller sets per call. None changes what an encoder
#: computes from ``input_ids``; a family that gives one a meaning (ESM's ``mask_token_id``) declares it, and its
#: declaration wins.
INERT_FIELDS = frozenset(
    {
        "torch_dtype",
        "dtype",
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "cls_token_id",
        "unk_token_id",
        "decoder_start_token_id",
        "output_past",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "use_bfloat16",
        "tokenizer_class",
        "prefix",
        "finetuning_task",
        "task_specific_params",
        "gradient_checkpointing",
        "max_length",
    }
)

_KIND_NAMES = {bool: "a boolean (true or false)", int: "an integer", float: "a number", str: "a string"}
_KIND_NAMES.update({list: "a list", dict: "a mapping"})


class UndeclaredFieldWarning(UserWarning):
    """A family read a ``config.json`` field it does not declare in :attr:`Family.fields` (a bug of the family:
    its type and range went unchecked). The field fuzz test fails on it for every registered family."""


@dataclass(frozen=True)
class HFField:
    """One declared ``config.json`` field.

    Attributes:
        kind: the JSON type, or a tuple of them: ``bool``, ``int``, ``float`` (an integer is a number too), ``str``,
            ``list``, ``dict``. ``true`` is no integer here (JSON has booleans; Python's ``True == 1`` is no excuse).
        ge: the smallest value a number may have.
        le: the largest value a number may have.
        gt: a bound a number must exceed.
        nullable: whether ``null`` is allowed (it means what the field's absence means, unless the family says
            otherwise).
        choices: the values a string (or each string of a list) may take, if only some; empty: any.
        items: the kind of a list's items (``str``, ``int``, …); ``None``: any JSON value.
        doc: one line for the docs.
    """

    kind: type | tuple[type, ...]
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    nullable: bool = False
    choices: tuple[Any, ...] = ()
    items: type | tuple[type, ...] | None = None
    doc: str = ""

    @property
    def kinds(self) -> tuple[type, ...]:
        return self.kind if isinstance(self.kind, tuple) else (self.kind,)

    def describe(self) -> str:
        """The declaration in words (``"an integer ≥ 0, or null"``)."""
        words = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in self.kinds)
        bounds = [
            f"≥ {_num(self.ge)}" if self.ge is not None else "",
            f"> {_num(self.gt)}" if self.gt is not None else "",
        ]
        bounds.append(f"≤ {_num(self.le)}" if self.le is not None else "")
        text = " ".join([words, *[b for b in bounds if b]])
        if self.choices:
            text += f" (one of {', '.join(repr(c) for c in self.choices)})"
        return text + (", or null" if self.nullable else "")

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit the declaration, or ``None``."""
        if value is None:
            return None if self.nullable else f"must be {self.describe()}, got null"
        if not any(_is(value, kind) for kind in self.kinds):
            return f"must be {self.describe()}, got the {type(value).__name__} {_short(value)}"
        if isinstance(value, int | float) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                return f"must be a finite number, got {value!r}"
            if (self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt):
                return f"must be {self.describe()}, got {value!r}"
            if self.le is not None and value > self.le:
                return f"must be {self.describe()}, got {value!r}"
        if isinstance(value, list):
            for i, item in enumerate(value):
                if self.items is not None and not any(_is(item, kind) for kind in _tuple(self.items)):
                    kinds = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in _tuple(self.items))
                    return f"must hold {kinds} only; item {i} is the {type(item).__name__} {_short(item)}"
                if self.choices and item not in self.choices:
                    return f"must hold {', '.join(repr(c) for c in self.choices)} only; item {i} is {item!r}"
        elif self.choices and isinstance(value, str) and value not in self.choices:
            return f"must be one of {', '.join(repr(c) for c in self.choices)}"
        return None


def field_issues(fields: Mapping[str, HFField], hf: Mapping[str, Any]) -> list[ConfigIssue]:
    """Every declared field of ``hf`` whose value does not fit its declaration, as located issues
    (``"token_dropout: token_dropout='false' is not supported: it must be a boolean (true or false), got the str"``).
    """
    issues = []
    for name, declared in fields.items():
        if name in hf:
            problem = declared.problem(hf[name])
            if problem is not None:
                issues.append(ConfigIssue(name, f"{name}={_short(hf[name])} is not supported: it {problem}"))
    return issues


def undeclared(fields: Mapping[str, HFField], given: Iterable[str], passed_through: Iterable[str]) -> list[str]:
    """The fields of a ``config.json`` (``given``) that a family read (did not hand back in ``passed_through``)
    without declaring them."""
    kept = set(passed_through)
    return sorted(k for k in given if k not in kept and k not in fields and k not in SHARED_FIELDS)


def unread(fields: Mapping[str, HFField], given: Iterable[str]) -> list[str]:
    """The fields of a ``config.json`` (``given``) that a family with the declaration ``fields`` does not read:
    neither declared nor shared nor transformers' inert bookkeeping (:data:`INERT_FIELDS`). Whatever they mean to
    the code that wrote them, the family's model does not honour it."""
    return sorted(k for k in given if k not in fields and k not in SHARED_FIELDS and k not in INERT_FIELDS)


def _is(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is dict:
        return isinstance(value, Mapping)
    return isinstance(value, kind)


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
