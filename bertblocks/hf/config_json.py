"""The one ``config.json`` translator: transformers' flat format ↔ a bertblocks config, both ways, through the
family its ``model_type`` names (``bert`` when it names none), BERT included.

A family (:class:`~bertblocks.families.family.Family`) translates its own fields; around it, this module
handles what every family shares:

* ``architectures``: transformers' task class names the head (the family's table); saving writes it back.
* the ``bertblocks`` block: what HF's fields cannot say (the attention backend, components transformers lacks,
  plugin options, per-layer overrides) travels under a ``bertblocks`` key, which transformers keeps as an inert
  attribute. It may add to the HF fields, never contradict them: ``num_attention_heads: 4`` beside
  ``bertblocks: {encoder: {attention: {num_heads: 8}}}`` would be one model to transformers and another to
  bertblocks, so loading stops and names both (and saving never writes such a file).
* strict JSON: a ``config.json`` holds JSON values only, and a ``bertblocks`` block that is not a mapping is
  an error, at load.

The translation is a config dict (the YAML form); :func:`bertblocks.load_config` validates it once, like any
other config.

Example:
    >>> data = config_from_hf(read_json(Path("bert/config.json")))   # bertblocks.readers.read_json
    >>> config_to_hf(bertblocks.load_config(data))["architectures"]
    ['BertModel']
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from ..config import DEFAULT_COMPONENTS, BertConfig, ConfigError, ConfigIssue, deep_merge
from ..config.schema import json_value_problem
from ..families.bertlike import BERT_FIELD_NAMES
from ..families.family import Family
from ..families.fields import UndeclaredFieldWarning, field_issues, undeclared, unread
from ..registry import Registry, validate_config
from .families import get_family, known_families
from .misspelt_keys import warn_misspelt_keys

#: the family a config.json without ``model_type`` is read as (transformers' BERT)
DEFAULT_FAMILY = DEFAULT_COMPONENTS["family"]
#: the key of bertblocks' own choices in a config.json
BLOCK = "bertblocks"
#: written by transformers at save time and meaningless to carry over (rewritten by whoever saves next);
#: ``_num_labels`` is older transformers' bookkeeping of ``num_labels`` (``id2label`` says the count)
DROPPED = ("_name_or_path", "_attn_implementation_autoset", "transformers_version", "_num_labels")
_SOURCE = "config.json"


def config_from_hf(hf: Mapping[str, Any], registry: Registry | None = None) -> dict[str, Any]:
    """An HF ``config.json`` dict → a bertblocks config dict (the YAML form), through its family.

    The ``bertblocks`` block (what :func:`config_to_hf` writes for choices HF cannot express) is merged over
    the family's translation.

    Raises:
        UnknownFamilyError: the ``model_type`` has no family.
        ConfigError: a value that is not JSON, a ``bertblocks`` block that is not a mapping or that contradicts
            an HF field (naming both), a field the family cannot represent, or a value that contradicts what the
            family requires (:attr:`Family.fixed`). A fixed value the translation leaves out is filled in, so a
            family states each fixed fact once, in ``fixed``.
    """
    problem = _depth_problem(hf) or json_value_problem(dict(hf), finite=False)
    if problem is not None:
        raise ConfigError([ConfigIssue("", problem)], _SOURCE)
    src = {k: v for k, v in hf.items() if k not in DROPPED}
    model_type = src.get("model_type") or DEFAULT_FAMILY
    if not isinstance(model_type, str):
        raise ConfigError([ConfigIssue("model_type", f"must be a string, got {model_type!r}")], _SOURCE)
    family = _claiming_family(get_family(model_type, registry), src, registry)
    _refuse_remote_code(family, src)
    ours = src.pop(BLOCK, {})
    if not isinstance(ours, Mapping):
        raise ConfigError(
            [ConfigIssue(BLOCK, f"must be a mapping of bertblocks' own choices, got {type(ours).__name__} {ours!r}")],
            _SOURCE,
        )
    data = _translate(family, src)
    data["family"] = family.model_type  # a remote-code format's family, not the model_type it is published under
    warn_misspelt_keys(data.get("hf") or {}, (*(family.fields or BERT_FIELD_NAMES), "architectures", BLOCK))
    issues = contradictions(family, src, data, ours)
    if issues:
        raise ConfigError(issues, _SOURCE)
    if ours:
        data = deep_merge(data, dict(ours))
    for path, required in family.fixed.items():
        value = _get(data, path)
        if value is not _MISSING and value != required:
            issues.append(
                ConfigIssue(
                    path, f"is {value!r}, but the {family.model_type} family requires {required!r} (config.json)"
                )
            )
    if data.get("family", family.model_type) != family.model_type:
        issues.append(
            ConfigIssue(
                f"{BLOCK}.family",
                f"is {data['family']!r}, but config.json's model_type is {model_type!r} (family {family.model_type!r})",
            )
        )
    if issues:
        raise ConfigError(issues, _SOURCE)
    return data


def config_to_hf(config: BertConfig, registry: Registry | None = None) -> dict[str, Any]:
    """A config → the ``config.json`` its family's transformers class reads; what that class cannot express
    goes under a ``bertblocks`` key, which :func:`config_from_hf` reads back.

    Raises:
        ConfigError: the config holds a value its family's fields would state otherwise (the file would mean
            one model to transformers and another to bertblocks).
    """
    family = get_family(config.family, registry, source=None)
    dumped = config.model_dump()
    # what loading refuses (config_from_hf: a value against the family's fixed facts) is refused here, before
    # anything is written: a saved folder always loads back
    against = [
        ConfigIssue(path, f"is {value!r}, but the {family.model_type} family requires {required!r}")
        for path, required in family.fixed.items()
        if (value := _get(dumped, path)) is not _MISSING and not _same(value, required)
    ]
    if against:
        hint = ConfigIssue(
            "family",
            f"the {family.model_type} family's config.json cannot describe this model; a model no transformers "
            "family describes is saved with family: bertblocks-hybrid",
        )
        raise ConfigError([*against, hint], f"saving a {family.model_type} config.json")
    out = family.config_to_hf(config)
    out.setdefault("model_type", family.model_type)  # a remote format's family writes its published one
    head = config.head.name if config.head is not None else None
    out.setdefault("architectures", [family.architecture_for(head)])
    if BLOCK in out:  # a family that writes the block itself
        return out
    translated = _translate(family, copy.deepcopy(out))
    # compared after validation, which fills every component option with its default: a default is no
    # difference
    back = validate_config({**translated, "family": family.model_type}, registry).model_dump()
    extra = _diff(config.model_dump(), back)  # a head the family has no class for travels here too
    if extra is not _MISSING:
        issues = contradictions(family, out, translated, extra)
        if issues:
            hint = ConfigIssue(
                "family",
                f"the {family.model_type} family's config.json cannot describe this model; a model no transformers "
                "family describes is saved with family: bertblocks-hybrid",
            )
            raise ConfigError([*issues, hint], f"saving a {family.model_type} config.json")
        out[BLOCK] = extra
    return out


def _claiming_family(family: Family, src: Mapping[str, Any], registry: Registry | None) -> Family:
    """The family that reads ``src``: the ``model_type``'s own, unless the file names remote-code classes
    (``auto_map``) that another family translates and publishes under this ``model_type``
    (:attr:`Family.remote_model_types`: Jina-embeddings-v2 as ``bert``, v3 as ``xlm-roberta``)."""
    auto_map = src.get("auto_map")
    if auto_map is None or family.reads_remote(src):
        return family
    for candidate in known_families(registry):
        if family.model_type in candidate.remote_model_types and candidate.reads_remote(src):
            return candidate
    return family


class RemoteClassesIgnoredWarning(UserWarning):
    """A config.json's ``auto_map`` names remote-code classes that bertblocks does not run, and every field of the
    file is one its family reads: the model is built with the family's own modelling, as transformers builds it
    without ``trust_remote_code`` (BAAI's bge-reranker-v2-m3 names ``XLMRobertaFlash*`` classes that compute
    XLM-R's math with another kernel)."""


def _refuse_remote_code(family: Family, src: Mapping[str, Any]) -> None:
    """Decide what to do with a config.json whose ``auto_map`` names remote-code classes the family does not
    translate: by its fields, not by the ``auto_map``.

    * A family whose format *is* remote code (:attr:`Family.remote_code` declared: NomicBERT's original fields,
      GTE's ``new``, EuroBERT) reads only the declared classes from the declared repository; any other code is
      refused, since its fields mean what that other code makes of them.
    * A transformers-native family (no ``remote_code``) builds the file when it reads every field of it
      (:attr:`Family.fields`, plus transformers' inert bookkeeping): the remote classes can then only be another
      implementation of the same computation, and a one-line :class:`RemoteClassesIgnoredWarning` names them.
      A field the family does not read may change what the remote code computes (Jina-embeddings-v2's
      ``feed_forward_type``: ALiBi and a gated MLP under ``model_type: bert``), so the file is refused, naming
      those fields; building the plain model would load "successfully" and be wrong for the weights.

    Nothing ``auto_map`` names is ever imported.
    """
    auto_map = src.get("auto_map")
    if auto_map is None or family.reads_remote(src):
        return
    if isinstance(auto_map, Mapping):
        # a tokenizer class changes no model (bertblocks reads tokenizer.json); config and model classes do
        classes = sorted({str(v) for k, v in auto_map.items() if k != "AutoTokenizer"})
        if not classes:
            return
    else:
        classes = [repr(auto_map)]
    named = f"names remote-code classes ({', '.join(classes)}) that the {family.model_type} family does not implement"
    others = unread(family.fields, src) if not family.remote_code else []
    if not family.remote_code and not others:
        warnings.warn(
            f"config.json: auto_map {named}; every field of the file is one the family reads, so it is built as "
            f"{family.model_type}'s own model (as transformers without trust_remote_code builds it), and the remote "
            "classes are neither imported nor run",
            RemoteClassesIgnoredWarning,
            stacklevel=4,
        )
        return
    why = (
        f"and the file holds fields the family does not read ({', '.join(others)}), which may change what that "
        "code computes; "
        if others
        else f"and the {family.model_type} format is that of its own remote code, not this one; "
    )
    raise ConfigError(
        [
            ConfigIssue(
                "auto_map",
                f"{named}, {why}building a plain {family.model_type} model from it would not be the model its "
                "weights were trained as, and bertblocks never runs code from a checkpoint. Port the architecture "
                "as a family plugin (docs/explanation/model-families.md), or, if the checkpoint really is a plain "
                f"{family.model_type} model, remove auto_map from its config.json",
            )
        ],
        _SOURCE,
    )


#: how deeply a config.json may nest (transformers' deepest, ModernBERT's per-layer rope parameters, is 3 levels)
MAX_DEPTH = 64


def _depth_problem(hf: Mapping[str, Any]) -> str | None:
    """Why ``hf`` nests too deeply to be a config.json (an iterative walk: no recursion to run out of)."""
    stack: list[tuple[Any, int]] = [(hf, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nests deeper than {MAX_DEPTH} levels; no model's config.json does"
        if isinstance(value, Mapping):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list | tuple):
            stack.extend((item, depth + 1) for item in value)
    return None


def _translate(family: Family, src: Mapping[str, Any]) -> dict[str, Any]:
    """The family's translation of ``src`` (``bertblocks`` block and bookkeeping removed), with the head that
    ``architectures`` names."""
    architectures = src.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(name, str) for name in architectures)
    ):
        issue = ConfigIssue("architectures", f"must be a list of transformers class names, got {architectures!r}")
        raise ConfigError([issue], _SOURCE)
    if architectures == []:  # names no class: the same as no `architectures` (families index it)
        src = {key: value for key, value in src.items() if key != "architectures"}
        architectures = None
    head = None
    if isinstance(architectures, list) and len(architectures) == 1:
        head = family.head_for(architectures[0])
    # the family's declaration, checked before its code sees a value: "false" is no boolean, 1.5 no size
    issues = field_issues(family.fields, src)
    if issues:
        raise ConfigError(issues, _SOURCE)
    try:
        data = family.config_from_hf(dict(src))  # it may read `architectures` (ELECTRA's generator sizes its head)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError([ConfigIssue("", f"{family.model_type}: {e}")], _SOURCE) from None
    read = undeclared(family.fields, src, (data.get("hf") or {}) if isinstance(data, Mapping) else ())
    if read:
        # a warning, not an error: the family (a plugin's, maybe) is at fault, not the file; the field fuzz test
        # turns it into a failure for every registered family
        warnings.warn(
            f"the {family.model_type} family read config.json fields it does not declare ({', '.join(read)}): a "
            "family declares every field it reads, with its type and range, in Family.fields, so that no value "
            'reaches its code unchecked (docs/plugins/writing-a-plugin.md, "Writing a family")',
            UndeclaredFieldWarning,
            stacklevel=3,
        )
    if head is not None and data.get("head") is None:
        data["head"] = head
    for path, required in family.fixed.items():  # the family's fixed facts, stated once: not repeated by translators
        if _get(data, path) is _MISSING:
            _set_missing(data, path, required)
    return data


def contradictions(
    family: Family, src: Mapping[str, Any], data: Mapping[str, Any], ours: Mapping[str, Any]
) -> list[ConfigIssue]:
    """Where the ``bertblocks`` block ``ours`` says otherwise than an HF field of ``src`` (translated: ``data``).

    Scalars are compared (a count, a rate, a component's name); lists, such as per-layer overrides, are
    structure the block refines (ModernBERT's layer pattern plus a layer of its own). A value the family sets
    without any field saying so (DistilBERT's one token type) is no contradiction: the block may change it.
    Which field says a value is found by translating ``src`` without each field in turn, so it works for every
    family's names (``n_heads``, ``num_attention_heads``) without a table of them.
    """
    issues = []
    for path, theirs in _leaves(ours):
        if path == "family" or path.split(".")[0] == "hf" or isinstance(theirs, list):
            continue  # the family has its own message; `hf` is never translated; lists are refined
        mine = _get(data, path)
        if isinstance(theirs, str) and isinstance(mine, Mapping):  # a component's shorthand: its name
            path, mine = f"{path}.name", mine.get("name", _MISSING)
        if mine is _MISSING or _same(mine, theirs):
            continue
        fields = [key for key in src if key not in ("model_type", BLOCK) and _changes(family, src, key, path, mine)]
        if fields:
            said = " and ".join(f"{key} is {src[key]!r}" for key in fields)
            issues.append(
                ConfigIssue(
                    f"{BLOCK}.{path}",
                    f"is {theirs!r}, but config.json's {said}; the bertblocks block may add what HF fields cannot "
                    "say, never contradict them (transformers would build another model)",
                )
            )
    return issues


def _changes(family: Family, src: Mapping[str, Any], key: str, path: str, value: Any) -> bool:
    """Whether ``key`` decides what the translation puts at ``path``: leaving it out, or giving it another
    value (a field holding its default changes nothing by leaving), changes it."""
    variants = [{k: v for k, v in src.items() if k != key}]
    other = _another(src[key])
    if other is not _MISSING:
        variants.append({**src, key: other})
    for variant in variants:
        try:
            translated = _translate(family, variant)
        except ConfigError:
            continue  # the family cannot do without it (or with that value); other variants or fields decide
        if not _same(_get(translated, path), value):
            return True
    return False


def _another(value: Any) -> Any:
    """A value of the same JSON type that differs from ``value`` (``_MISSING`` for lists, mappings, null)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "_"
    return _MISSING


def _same(a: Any, b: Any) -> bool:
    # True == 1 in Python; in a config they are different statements
    return (isinstance(a, bool) == isinstance(b, bool)) and a == b


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted path, value)`` of every non-mapping value in ``tree``."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


_MISSING = object()


def _set_missing(data: dict[str, Any], path: str, value: Any) -> None:
    """Put ``value`` at a dotted ``path`` that :func:`_get` found missing, making the mappings on the way (a
    component's shorthand name becomes ``{name: …}`` so that its options can be added)."""
    node = data
    *parents, last = path.split(".")
    for part in parents:
        child = node.get(part)
        if isinstance(child, str):
            child = {"name": child}
        elif not isinstance(child, Mapping):
            child = {}
        node[part] = child = dict(child)
        node = child
    node[last] = value


def _get(data: Any, path: str) -> Any:
    """The value at a dotted ``path`` (a component's shorthand name answers ``….name``), or ``_MISSING``."""
    node: Any = data
    for part in path.split("."):
        if isinstance(node, str):
            if part != "name":
                return _MISSING
            return node
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _diff(full: Any, base: Any) -> Any:
    """The parts of ``full`` that differ from ``base`` (nested dicts), or ``_MISSING`` if none do (a value that
    differs may be ``None``: a config without a pooler where the family's has one)."""
    if isinstance(full, dict) and isinstance(base, dict):
        if "name" in full and full.get("name") != base.get("name"):
            # another component: reading it back starts its spec afresh (its plugin's options are not the
            # other's), so every field travels, the typed ones (num_heads, intermediate_size) included
            return {k: v for k, v in full.items() if k != "hf"}
        out = {}
        for key, value in full.items():
            if key == "hf":
                continue
            if key not in base:
                out[key] = value
                continue
            sub = _diff(value, base[key])
            if sub is not _MISSING:
                out[key] = sub
        # a component's name must travel with its options, or from_hf would not know whose they are
        if out and "name" in full and "name" not in out:
            out["name"] = full["name"]
        return out or _MISSING
    return _MISSING if full == base else full


__all__ = ["BLOCK", "DEFAULT_FAMILY", "RemoteClassesIgnoredWarning", "config_from_hf", "config_to_hf", "contradictions"]
