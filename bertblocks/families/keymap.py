"""Declarative checkpoint key maps: how one model family's checkpoint keys relate to bertblocks' own.

A bertblocks model always has BERT's module names (``bert.encoder.layer.0.attention.self.query.weight``,
``cls.predictions.decoder.weight`` …). Other families store the same tensors under other names, fused, or
once for many layers. A family plugin describes the difference with a :class:`KeyMap` — a list of rules,
no code — and :func:`to_model` / :func:`to_checkpoint` apply it in the two directions. Both are pure
functions over state dicts (``{key: tensor}``), so a map can be tested without a model.

Patterns are dotted key prefixes with named placeholders for numbers, e.g. ``roberta.encoder.layer.{i}``.
A pattern matches a key that equals it or continues it at a dot (``…query`` matches ``…query.weight``, never
``…query_proj.weight``); the rest of the key (``.weight``) is carried over. Placeholders match decimal
numbers and are substituted on the other side.

Rules (the first rule whose pattern matches a key applies; keys no rule matches keep their name):

* :class:`Rename` — one tensor, another name (``lm_head.dense`` ↔ ``cls.predictions.transform.dense``); with
  ``if_model_has``, on load only where the model has the renamed key (one family, two layouts).
* :class:`Split` — one fused checkpoint tensor ↔ several model tensors concatenated along a dimension
  (``Wqkv`` ↔ ``query``/``key``/``value``; ``Wi`` ↔ input/gate).
* :class:`Join` — the converse: several checkpoint tensors ↔ one fused model tensor (``q_proj``/``k_proj``/
  ``v_proj`` ↔ ``Wqkv``; ``gate_proj``/``up_proj`` ↔ a fused GLU input).
* :class:`Shared` — one stored tensor used by N layers (ALBERT's layer group ↔ ``encoder.layer.{i}``).
* :class:`Drop` — checkpoint keys that are known and carry nothing (stale buffers); never written.
* :class:`AbsentBias` — model tensors the format does not store (a bias the family does not have): zeros
  on load, left out on save.

Any rule may be restricted to some heads (``heads=(...)``, head names): DistilBERT's sequence
classifier stores ``pre_classifier`` + ``classifier`` where its token classifier stores ``classifier`` alone.

:class:`KeyMap` is also the one type the load and save path (:mod:`bertblocks.models.pretrained`) holds: whatever
translates a whole state dict both ways (``to_model(state)``, ``to_checkpoint(state)``) *is* a key map
(``isinstance`` checks the two methods), so a family's declarative map, BERT's (:data:`BERT_KEY_MAP`), a map
bound to a model (:class:`bertblocks.hf.families.FamilyKeyMap`) and the encoder-decoder's map of its two sides are
all key maps (``KeyMap`` instances), and none is a second protocol. Legacy spellings of old Google conversions
(``LayerNorm.gamma``/``beta``) read as today's ``weight``/``bias`` in every map, on load.
"""

from __future__ import annotations

import re
from abc import ABC
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from ..errors import BertBlocksError

#: where bertblocks keeps a task model's backbone (its ``bert`` attribute, so its keys read ``bert.encoder.…``):
#: the model side of every key map, whatever the family (its own checkpoint prefix is :attr:`KeyMap.prefix`)
BACKBONE_PREFIX = "bert"
#: spellings of old Google conversions (``LayerNorm.gamma``) → the names every checkpoint uses today
LEGACY_SUFFIXES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


class KeyMapError(BertBlocksError, ValueError):
    """A checkpoint that the key map cannot translate; the message names the key and what was expected."""


# ------------------------------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rename:
    """One tensor stored under another name.

    Attributes:
        checkpoint: pattern of the checkpoint's key (``distilbert.transformer.layer.{i}.attention.q_lin``).
        model: pattern of bertblocks' key (``bert.encoder.layer.{i}.attention.self.query``).
        heads: only for these heads (empty: always).
        if_model_has: on load, only where the model being loaded has the renamed key (its shapes say so);
            elsewhere the next rule decides. For one checkpoint key that names different tensors in two layouts of
            one family: X-MOD's ``attention.output.LayerNorm`` ends a post-LN attention sub-layer (bertblocks'
            key is the same) or begins a pre-norm one (bertblocks' ``attention_norm``). On save the model's key
            itself says which layout it is.
    """

    checkpoint: str
    model: str
    heads: tuple[str, ...] = ()
    if_model_has: bool = False


@dataclass(frozen=True)
class Split:
    """One fused checkpoint tensor holding several model tensors, concatenated along ``dim``.

    The parts' sizes come from the model's shapes (they may differ, as grouped-query projections do), or
    are equal when no shapes are known. A fused tensor whose size is not the parts' sum is an error naming
    the key and the expected shape.

    Attributes:
        checkpoint: pattern of the fused key (``model.layers.{i}.attn.Wqkv``).
        model: patterns of the parts, in concatenation order.
        dim: the concatenation dimension (0: output features of a linear layer).
        heads: only for these heads (empty: always).
    """

    checkpoint: str
    model: tuple[str, ...]
    dim: int = 0
    heads: tuple[str, ...] = ()


@dataclass(frozen=True)
class Join:
    """Several checkpoint tensors held by one fused model tensor, concatenated along ``dim`` (the converse of
    :class:`Split`).

    On load the parts are concatenated in the order given (all must be present: a missing one is an error naming
    it); on save the model tensor is cut into equal parts (a size the parts cannot share equally is an error).

    Attributes:
        checkpoint: patterns of the parts, in concatenation order (``….self_attn.q_proj``, ``k_proj``, ``v_proj``).
        model: pattern of the fused model key (``bert.encoder.layer.{i}.attention.self.Wqkv``).
        dim: the concatenation dimension (0: output features of a linear layer).
        heads: only for these heads (empty: always).
    """

    checkpoint: tuple[str, ...]
    model: str
    dim: int = 0
    heads: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shared:
    """One stored tensor that N model tensors share (cross-layer sharing).

    The model pattern has a placeholder the checkpoint pattern lacks (``{i}``): on load the tensor goes to
    every index the model has; on save the copies (one tensor, tied) are written once — copies that differ
    are an error, as the format cannot store them.

    Attributes:
        checkpoint: pattern of the stored key (``albert.encoder.albert_layer_groups.0.albert_layers.0``).
        model: pattern of the model keys (``bert.encoder.layer.{i}``).
        heads: only for these heads (empty: always).
    """

    checkpoint: str
    model: str
    heads: tuple[str, ...] = ()


@dataclass(frozen=True)
class Drop:
    """Checkpoint keys that are known but hold nothing the model needs (e.g. stale buffers); never written.

    Attributes:
        checkpoint: pattern of the keys dropped on load.
        heads: only for these heads (empty: always).
    """

    checkpoint: str
    heads: tuple[str, ...] = ()


@dataclass(frozen=True)
class AbsentBias:
    """Model tensors the checkpoint format does not store: zeros on load, left out on save.

    Saving a non-zero one is an error: the format would lose it.

    Attributes:
        model: pattern of the model keys (``bert.encoder.layer.{i}.attention.self.query.bias``).
        heads: only for these heads (empty: always).
    """

    model: str
    heads: tuple[str, ...] = ()


Rule = Rename | Split | Join | Shared | Drop | AbsentBias


@dataclass(frozen=True)
class KeyMap(ABC):
    """A family's checkpoint layout relative to bertblocks' keys, and the type of every key map.

    Any class with ``to_model(state)`` and ``to_checkpoint(state)`` (whole state dicts in, whole state dicts out:
    a map may split, join or drop tensors, not only rename) counts as a ``KeyMap`` for ``isinstance``; this class
    is the declarative one, whose two methods apply its rules.

    Attributes:
        prefix: the family's backbone prefix in task checkpoints (RoBERTa's is roberta); keys under it that no rule
            matches are bertblocks' keys under ``model_prefix`` (``roberta.encoder.…`` ↔ ``bert.encoder.…``).
        model_prefix: bertblocks' backbone prefix (:data:`BACKBONE_PREFIX`).
        rules: the rules, first match wins.
        head_prefixes: top-level checkpoint key prefixes of the family's heads (``lm_head.``, ``classifier.``):
            a key outside these and the backbone fits nowhere, which strict loading reports.
    """

    prefix: str
    rules: tuple[Rule, ...] = ()
    model_prefix: str = BACKBONE_PREFIX
    head_prefixes: tuple[str, ...] = ()

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        # structural, as collections.abc's: a map bound to a model need not be built from rules
        if cls is KeyMap and all(callable(getattr(other, name, None)) for name in ("to_model", "to_checkpoint")):
            return True
        return NotImplemented

    def to_model(
        self,
        state: Mapping[str, torch.Tensor],
        *,
        head: str | None = None,
        shapes: Mapping[str, Iterable[int]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Checkpoint keys → bertblocks' keys (:func:`to_model`)."""
        return to_model(state, self, head=head, shapes=shapes)

    def to_checkpoint(self, state: Mapping[str, torch.Tensor], *, head: str | None = None) -> dict[str, torch.Tensor]:
        """bertblocks' keys → the checkpoint's (:func:`to_checkpoint`)."""
        return to_checkpoint(state, self, head=head)

    def rules_for(self, head: str | None) -> list[Rule]:
        """The rules that apply to a model with ``head`` (``None``: a backbone), then the prefix rule."""
        chosen = [r for r in self.rules if not r.heads or (head is not None and head in r.heads)]
        if self.prefix != self.model_prefix:
            chosen.append(Rename(self.prefix, self.model_prefix))
        return chosen

    def knows(self, checkpoint_key: str) -> bool:
        """Whether a checkpoint key belongs to this family's format at all (backbone, a head, a rule)."""
        if _starts(checkpoint_key, self.prefix) or checkpoint_key.startswith(self.head_prefixes):
            return True
        for rule in self.rules:
            pattern = getattr(rule, "checkpoint", None)
            patterns = pattern if isinstance(pattern, tuple) else (pattern,) if pattern is not None else ()
            if any(_Pattern(p).match(checkpoint_key) is not None for p in patterns):
                return True
        return False


# ---------------------------------------------------------------------------------------------- patterns
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class _Pattern:
    text: str
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    names: tuple[str, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        parts, names, last = [], [], 0
        for m in _PLACEHOLDER.finditer(self.text):
            parts.append(re.escape(self.text[last : m.start()]))
            if m.group(1) in names:
                parts.append(f"(?P={m.group(1)})")
            else:
                parts.append(rf"(?P<{m.group(1)}>\d+)")
                names.append(m.group(1))
            last = m.end()
        parts.append(re.escape(self.text[last:]))
        # the pattern ends at a dot or at the end of the key: `query` never matches `query_proj`
        object.__setattr__(self, "regex", re.compile("".join(parts) + r"(?P<_rest>(\..*)?)$"))
        object.__setattr__(self, "names", tuple(names))

    def match(self, key: str) -> tuple[dict[str, str], str] | None:
        """``(placeholder values, rest of the key)``, or ``None``."""
        m = self.regex.match(key)
        if m is None:
            return None
        values = {n: m.group(n) for n in self.names}
        return values, m.group("_rest")

    def fill(self, values: Mapping[str, str], rest: str = "") -> str:
        try:
            return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.text) + rest
        except KeyError as e:
            raise KeyMapError(f"pattern {self.text!r} uses placeholder {{{e.args[0]}}} the other side lacks") from None


def _renamed(key: str, suffixes: Mapping[str, str]) -> str:
    """``key`` with the first of ``suffixes`` it ends with replaced (unchanged when none)."""
    for old, new in suffixes.items():
        if key.endswith(old):
            return key[: -len(old)] + new
    return key


def _starts(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def _shape(shapes: Mapping[str, Iterable[int]] | None, key: str) -> tuple[int, ...] | None:
    if shapes is None or key not in shapes:
        return None
    return tuple(shapes[key])


# ------------------------------------------------------------------------------------------- load: →model
def to_model(
    state: Mapping[str, torch.Tensor],
    key_map: KeyMap,
    *,
    head: str | None = None,
    shapes: Mapping[str, Iterable[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """Translate a checkpoint's state dict into bertblocks' keys.

    Args:
        state: the checkpoint's tensors under the family's keys.
        key_map: the family's map.
        head: the model's head name (rules restricted to other heads do not apply); ``None``: a backbone.
        shapes: bertblocks' key → shape of the model being loaded: sizes the parts of fused tensors and
            says which layers share a stored tensor. Without it, fused tensors split evenly and shared
            tensors cannot be expanded.

    Raises:
        KeyMapError: a fused tensor whose size is not the sum of its parts (naming key and expected shape),
            or a shared tensor with no model shapes to fan out to.
    """
    state = {_renamed(key, LEGACY_SUFFIXES): tensor for key, tensor in state.items()}  # see PARITY.md §2.3
    rules = key_map.rules_for(head)
    compiled = [(rule, _compile(rule)) for rule in rules]
    out: dict[str, torch.Tensor] = {}
    joined: dict[str, tuple[Join, dict[int, tuple[str, torch.Tensor]], Mapping[str, str], str]] = {}
    for key, tensor in state.items():
        for rule, (ckpt, models) in compiled:
            if isinstance(rule, Join):
                part = _join_part(rule, key)
                if part is None:
                    continue
                index, values, rest = part
                target = models[0].fill(values, rest)
                entry = joined.setdefault(target, (rule, {}, values, rest))
                if entry[0] is not rule:  # two formats' parts in one checkpoint: no order would be right
                    raise KeyMapError(
                        f"{key!r} and {entry[1][min(entry[1])][0]!r} both join into {target!r} under different rules "
                        "(a checkpoint mixing two formats)"
                    )
                entry[1][index] = (key, tensor)
                break
            if ckpt is None:
                continue
            found = ckpt.match(key)
            if found is None:
                continue
            values, rest = found
            if isinstance(rule, Drop):
                break
            if isinstance(rule, Rename):
                target = models[0].fill(values, rest)
                if rule.if_model_has and (shapes is None or target not in shapes):
                    continue  # another layout of the family: the next rule decides
                out[target] = tensor
            elif isinstance(rule, Split):
                out.update(_split(key, tensor, rule, [m.fill(values, rest) for m in models], shapes))
            elif isinstance(rule, Shared):
                targets = _shared_targets(models[0], values, rest, shapes)
                if not targets:
                    raise KeyMapError(
                        f"checkpoint tensor {key!r} is shared by layers ({rule.model!r}), but the model has no "
                        "such keys (or no model shapes were given to find them)"
                    )
                out.update(dict.fromkeys(targets, tensor))
            break
        else:
            out[key] = tensor
    for target, (rule, parts, values, rest) in joined.items():
        if sorted(parts) != list(range(len(rule.checkpoint))):
            missing = [_Pattern(p).fill(values, rest) for i, p in enumerate(rule.checkpoint) if i not in parts]
            present = [parts[i][0] for i in sorted(parts)]
            raise KeyMapError(
                f"checkpoint tensors {present} are parts of {target!r}, but {missing} are missing (rule Join)"
            )
        out[target] = torch.cat([parts[i][1] for i in range(len(parts))], dim=rule.dim)
    for rule, (_, models) in compiled:
        if isinstance(rule, AbsentBias) and shapes is not None:
            for model_key, shape in shapes.items():
                if models[0].match(model_key) is not None and model_key not in out:
                    out[model_key] = torch.zeros(tuple(shape))
    return out


def _join_part(rule: Join, key: str) -> tuple[int, dict[str, str], str] | None:
    """Which part of ``rule`` the checkpoint ``key`` is: ``(index, placeholder values, rest)``, or ``None``."""
    for index, pattern in enumerate(rule.checkpoint):
        found = _Pattern(pattern).match(key)
        if found is not None:
            return index, found[0], found[1]
    return None


def _compile(rule: Rule) -> tuple[_Pattern | None, list[_Pattern]]:
    if isinstance(rule, Join):
        return None, [_Pattern(rule.model)]
    if isinstance(rule, Rename | Shared):
        return _Pattern(rule.checkpoint), [_Pattern(rule.model)]
    if isinstance(rule, Split):
        return _Pattern(rule.checkpoint), [_Pattern(m) for m in rule.model]
    if isinstance(rule, Drop):
        return _Pattern(rule.checkpoint), []
    return None, [_Pattern(rule.model)]


def _split(
    key: str,
    tensor: torch.Tensor,
    rule: Split,
    targets: list[str],
    shapes: Mapping[str, Iterable[int]] | None,
) -> dict[str, torch.Tensor]:
    dim = rule.dim if rule.dim >= 0 else tensor.dim() + rule.dim
    part_shapes = [_shape(shapes, t) for t in targets]
    if all(s is not None for s in part_shapes):
        sizes = [s[dim] for s in part_shapes]  # type: ignore[index]
        expected = list(part_shapes[0])  # type: ignore[arg-type]
        expected[dim] = sum(sizes)
        if tuple(tensor.shape) != tuple(expected):
            raise KeyMapError(
                f"checkpoint tensor {key!r} has shape {tuple(tensor.shape)}, but the model expects the fused "
                f"shape {tuple(expected)} (= {' + '.join(map(str, sizes))} along dim {dim} for "
                f"{', '.join(targets)})"
            )
    else:
        n = len(targets)
        if tensor.dim() <= dim or tensor.shape[dim] % n:
            raise KeyMapError(
                f"checkpoint tensor {key!r} of shape {tuple(tensor.shape)} cannot be split into {n} equal parts "
                f"along dim {dim} ({', '.join(targets)})"
            )
        sizes = [tensor.shape[dim] // n] * n
    return dict(zip(targets, tensor.split(sizes, dim=dim), strict=True))


def _shared_targets(
    model: _Pattern, values: Mapping[str, str], rest: str, shapes: Mapping[str, Iterable[int]] | None
) -> list[str]:
    if shapes is None:
        return []
    out = []
    for model_key in shapes:
        found = model.match(model_key)
        if found is None:
            continue
        their_values, their_rest = found
        if their_rest == rest and all(their_values.get(k) == v for k, v in values.items()):
            out.append(model_key)
    return out


# ------------------------------------------------------------------------------------------ save: →ckpt
def to_checkpoint(
    state: Mapping[str, torch.Tensor], key_map: KeyMap, *, head: str | None = None
) -> dict[str, torch.Tensor]:
    """Translate bertblocks' state dict into the family's checkpoint keys (the inverse of :func:`to_model`).

    Raises:
        KeyMapError: parts of a fused tensor missing, copies of a shared tensor that differ, or a non-zero
            tensor the format does not store (:class:`AbsentBias`).
    """
    rules = key_map.rules_for(head)
    compiled = [(rule, _compile(rule)) for rule in rules]
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[int, torch.Tensor]] = {}
    fused_rule: dict[str, Split] = {}
    for key, tensor in state.items():
        for rule, (ckpt, models) in compiled:
            if isinstance(rule, Drop):
                continue
            if isinstance(rule, AbsentBias):
                if models[0].match(key) is not None:
                    if bool(torch.count_nonzero(tensor)):
                        raise KeyMapError(
                            f"{key!r} is not zero, but this checkpoint format stores no such tensor "
                            f"(rule AbsentBias({rule.model!r})); it would be lost"
                        )
                    break
                continue
            if isinstance(rule, Join):
                found = models[0].match(key)
                if found is None:
                    continue
                out.update(_cut(key, tensor, rule, [_Pattern(p).fill(*found) for p in rule.checkpoint]))
                break
            assert ckpt is not None
            hit = next(((i, m.match(key)) for i, m in enumerate(models) if m.match(key) is not None), None)
            if hit is None:
                continue
            index, (values, rest) = hit  # type: ignore[misc]
            if isinstance(rule, Split):
                name = ckpt.fill(values, rest)
                fused.setdefault(name, {})[index] = tensor
                fused_rule[name] = rule
            elif isinstance(rule, Shared):
                name = ckpt.fill({k: v for k, v in values.items() if k in ckpt.names}, rest)
                if name in out and _differ(out[name], tensor):
                    raise KeyMapError(
                        f"{key!r} differs from the other layers' copy of {name!r}, but the format stores one tensor "
                        f"for all of them (rule Shared({rule.checkpoint!r}, {rule.model!r}))"
                    )
                out.setdefault(name, tensor)
            else:
                out[ckpt.fill(values, rest)] = tensor
            break
        else:
            out[key] = tensor
    for name, parts in fused.items():
        rule = fused_rule[name]
        if sorted(parts) != list(range(len(rule.model))):
            missing = [rule.model[i] for i in range(len(rule.model)) if i not in parts]
            raise KeyMapError(f"cannot write fused {name!r}: parts {missing} are missing from the model")
        out[name] = torch.cat([parts[i] for i in range(len(parts))], dim=rule.dim)
    return out


def _cut(key: str, tensor: torch.Tensor, rule: Join, names: list[str]) -> dict[str, torch.Tensor]:
    """A fused model tensor cut into the equal checkpoint parts of a :class:`Join`."""
    n = len(names)
    dim = rule.dim if rule.dim >= 0 else tensor.dim() + rule.dim
    if tensor.dim() <= dim or tensor.shape[dim] % n:
        raise KeyMapError(
            f"{key!r} of shape {tuple(tensor.shape)} cannot be cut into {n} equal parts along dim {dim} "
            f"({', '.join(names)})"
        )
    return dict(zip(names, tensor.chunk(n, dim=dim), strict=True))


def _differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two copies of a shared tensor differ (shapes only for tensors without data, on ``meta``)."""
    if a is b:
        return False
    if a.is_meta or b.is_meta:
        return a.shape != b.shape
    return not torch.equal(a, b)


# ------------------------------------------------------------------------------------ suffix-only layouts
@dataclass(frozen=True)
class SuffixRenames(KeyMap):
    """A layout that differs from bertblocks' keys by key suffixes only: ``load`` applies when reading, ``save``
    when writing (empty: keys kept); the rules and the prefix of a :class:`KeyMap` apply after ``load``.

    Attributes:
        load: checkpoint suffix → model suffix (``"ffn_out.weight"`` → ``"output.dense.weight"``).
        save: model suffix → checkpoint suffix.

    Example:
        >>> sorted(SuffixRenames(load={"ffn_out.weight": "output.dense.weight"}).to_model({"x.ffn_out.weight": t}))
        ['x.output.dense.weight']
    """

    prefix: str = BACKBONE_PREFIX
    load: Mapping[str, str] = field(default_factory=dict)
    save: Mapping[str, str] = field(default_factory=dict)

    def to_model(
        self,
        state: Mapping[str, torch.Tensor],
        *,
        head: str | None = None,
        shapes: Mapping[str, Iterable[int]] | None = None,
    ) -> dict[str, torch.Tensor]:
        renamed = {_renamed(key, self.load): tensor for key, tensor in state.items()}
        return super().to_model(renamed, head=head, shapes=shapes)

    def to_checkpoint(self, state: Mapping[str, torch.Tensor], *, head: str | None = None) -> dict[str, torch.Tensor]:
        stored = super().to_checkpoint(state, head=head)
        return {_renamed(key, self.save): tensor for key, tensor in stored.items()}


#: BERT's layout: the model's keys are the checkpoint's (legacy LayerNorm spellings read as today's, as in every
#: map); the key map of a model class that names no family (``PretrainedModel.checkpoint_key_map``'s default)
BERT_KEY_MAP = KeyMap(prefix=BACKBONE_PREFIX, head_prefixes=("cls.", "classifier.", "qa_outputs."))
