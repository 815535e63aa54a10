"""Reading and writing configs: YAML (safe loading), HF ``config.json``, and dotted overrides.

Example:
    >>> cfg = load_config("examples/configs/bert-mini-relative.yaml", ["encoder.attention.backend=eager"])
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .atomic import write_text
from .config import BertConfig, ConfigError, ConfigFileNotFoundError, ConfigIssue
from .config.schema import json_value_problem
from .hf.config_json import config_from_hf, config_to_hf
from .readers import ReadError, parse_yaml, read_json, read_yaml
from .registry import Registry, UnknownPresetError, get_registry, validate_config

ConfigSource = str | Path | Mapping[str, Any] | BertConfig


def load_config(
    source: ConfigSource,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    registry: Registry | None = None,
) -> BertConfig:
    """Load, override and validate a config.

    Args:
        source: a YAML or JSON file, a directory holding ``config.json``, a dict, a config, or the name of a
            preset (``bert-base-uncased``; used when no file of that name exists). A JSON file (or dict) in
            HF's flat ``config.json`` format is converted.
        overrides: ``["encoder.attention.backend=eager", ...]`` (values parsed as YAML) or a mapping of dotted
            keys to values; applied before validation, so they are validated like the file.
        registry: where component names are looked up (default: the process-wide registry).

    Raises:
        FileNotFoundError: the file does not exist.
        UnknownPresetError: ``source`` is a bare name (no folder, no ``.yaml``/``.json``) that is neither a file
            nor a preset; the message lists the closest presets.
        ConfigError: malformed YAML/JSON (with the line) or an invalid config (every problem, with paths).
    """
    data, where = config_data(source, overrides, registry=registry)
    return validate_config(data, registry, source=where)


def config_data(
    source: ConfigSource, *overrides: Sequence[str] | Mapping[str, Any], registry: Registry | None = None
) -> tuple[dict[str, Any], str | None]:
    """The raw (not yet validated) config of ``source`` with each set of ``overrides`` applied in turn, and where
    it came from (a path, ``preset NAME``, or ``None`` for a dict or config), for error messages.

    What :func:`load_config` validates; :func:`bertblocks.create_model` adds its head before validating.
    """
    data, where = _read(source, registry)
    for layer in overrides:
        data = apply_overrides(_labels_follow_count(data, layer), layer)
    return data, where


def _labels_follow_count(data: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Drop default label names (``LABEL_0``, …) when the overrides set ``num_labels`` but no names.

    A checkpoint without ``id2label`` reads as two default labels; ``num_labels=3`` must then mean three
    default labels (transformers' rule), not a contradiction. Real label names are kept, so a count that
    contradicts them is still an error.
    """
    keys = set(overrides) if isinstance(overrides, Mapping) else {text.partition("=")[0].strip() for text in overrides}
    if "num_labels" not in keys or keys & {"id2label", "label2id"}:
        return data
    id2label = data.get("id2label")
    if isinstance(id2label, Mapping) and {int(k): v for k, v in id2label.items()} == {
        i: f"LABEL_{i}" for i in range(len(id2label))
    }:
        data = {k: v for k, v in data.items() if k not in ("id2label", "label2id")}
    return data


def _read(source: ConfigSource, registry: Registry | None = None) -> tuple[dict[str, Any], str | None]:
    if isinstance(source, BertConfig):
        return source.model_dump(), None
    if isinstance(source, Mapping):
        # a deep copy: overrides are set in place and must never change the caller's nested dicts
        return _from_mapping(copy.deepcopy(dict(source)), registry, None), None
    path = Path(source)
    if isinstance(source, str) and not path.exists() and _looks_like_a_name(source):
        reg = registry or get_registry()
        try:
            preset = reg.get_preset(source)
        except UnknownPresetError as e:
            raise UnknownPresetError(e.name, e.available, context=" (and no file of that name)") from None
        return _from_mapping(copy.deepcopy(dict(preset.config)), registry, f"preset {source}"), f"preset {source}"
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigFileNotFoundError(f"config file not found: {path}")
    try:  # the bounded readers: size, UTF-8, NUL, nesting, duplicate keys, YAML aliases ("billion laughs")
        data = read_json(path) if path.suffix == ".json" else read_yaml(path)
    except ReadError as e:
        raise ConfigError([ConfigIssue(e.location, e.problem)], str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue("", f"expected a mapping at the top, got {type(data).__name__}")], str(path))
    return _from_mapping(data, registry, str(path)), str(path)


def _looks_like_a_name(source: str) -> bool:
    """A preset name has no folder part and no config-file suffix (``bert-base-uncased``, not ``x/y.yaml``)."""
    return "/" not in source and "\\" not in source and Path(source).suffix not in (".yaml", ".yml", ".json")


def is_hf_config(data: Mapping[str, Any]) -> bool:
    """HF's flat format has ``model_type`` or ``num_hidden_layers``; ours nests ``encoder``."""
    return "encoder" not in data and ("model_type" in data or "num_hidden_layers" in data)


def _from_mapping(data: dict[str, Any], registry: Registry | None = None, where: str | None = None) -> dict[str, Any]:
    # a config is what JSON can hold: a YAML date or set, or a Python object, is refused here rather than when
    # the config is first written to a config.json
    problem = json_value_problem(data, finite=False)
    if problem is not None:
        raise ConfigError([ConfigIssue("", problem)], where)
    if is_hf_config(data):
        # through the family its model_type names (bert when none): the one place config.json is read
        return config_from_hf(data, registry)
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Set dotted keys in a raw config dict: ``encoder.attention.backend=eager``, ``encoder.overrides.0.layers=3``.

    Values given as strings are parsed as YAML (``12`` is an int, ``[1, 2]`` a list, ``null`` None).
    """
    items: list[tuple[str, Any]]
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        items = []
        for text in overrides:
            key, sep, value = text.partition("=")
            if not sep or not key.strip():
                raise ConfigError([ConfigIssue("", f"override {text!r} is not of the form dotted.key=value")])
            items.append((key.strip(), _override_value(key.strip(), value)))
    for key, value in items:
        _set_dotted(data, key, value)
    return data


def _override_value(key: str, value: str) -> Any:
    """The value of ``key=value`` parsed as YAML (empty: ``None``); unreadable YAML is a located error."""
    if not value.strip():
        return None
    try:
        return parse_yaml(value, key)
    except ReadError as e:
        problem = e.problem.removeprefix("malformed YAML: ")
        raise ConfigError(
            [ConfigIssue(key, f"cannot read the value {value!r} as YAML ({problem}); quote it if it is text")]
        ) from None


def with_backend(
    overrides: Sequence[str] | Mapping[str, Any], attn_implementation: str | None
) -> list[str] | dict[str, Any]:
    """A copy of ``overrides`` that also sets ``encoder.attention.backend`` when ``attn_implementation`` is given
    (transformers' name for the same choice)."""
    if isinstance(overrides, Mapping):
        extra: dict[str, Any] = dict(overrides)
        if attn_implementation is not None:
            extra["encoder.attention.backend"] = attn_implementation
        return extra
    items = list(overrides)
    if attn_implementation is not None:
        items.append(f"encoder.attention.backend={attn_implementation}")
    return items


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        where = ".".join(parts[: i + 1])
        if isinstance(node, list):
            index = _list_index(node, part, where, append=True)
            if index == len(node):  # `encoder.overrides.0.layers=3` on an empty list starts a new item
                node.append({})
            node = node[index]
            continue
        child = node.get(part)
        if isinstance(child, str):
            child = node[part] = {"name": child}  # `backend: sdpa` shorthand, now given options
        elif child is None:
            child = node[part] = [] if parts[i + 1].isdigit() else {}
        elif not isinstance(child, dict | list):
            raise ConfigError([ConfigIssue(where, f"is a {type(child).__name__}, cannot set {key!r} inside it")])
        node = child
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(node, last, key)] = value
    else:
        node[last] = value


def _list_index(node: list[Any], part: str, where: str, append: bool = False) -> int:
    """``part`` as an index into ``node``; with ``append``, ``len(node)`` (one past the end) is allowed too."""
    stop = len(node) + 1 if append else len(node)
    if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < stop:
        raise ConfigError([ConfigIssue(where, f"no item {part!r} in a list of {len(node)}")])
    return int(part)


def dump_yaml(config: BertConfig) -> str:
    """The config as YAML, every field written (what ``load_config`` reads back equal)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def save_config(config: BertConfig, path: str | Path) -> None:
    """Write ``.yaml``/``.yml`` (ours) or ``.json`` (HF ``config.json`` format), atomically
    (:func:`bertblocks.atomic.write_file`)."""
    path = Path(path)
    if path.suffix == ".json":
        write_text(path, json.dumps(config_to_hf(config), indent=2, sort_keys=True) + "\n")
    else:
        write_text(path, dump_yaml(config))
