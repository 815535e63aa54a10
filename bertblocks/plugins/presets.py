"""The built-in zoo: every ``bertblocks/presets/<name>.yaml`` shipped in the package becomes the preset ``<name>``.

Registered through ``bertblocks_register_presets``, the hook a third-party plugin implements to add its own
presets. Each file is an ordinary config file (what ``bertblocks build FILE`` reads); its first comment line,
``# <name>: <description>``, is the description shown in listings.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from bertblocks.core.component import Preset
from bertblocks.readers import parse_yaml

from ..errors import InputError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable  # Python 3.11+; only needed by type checkers

PRESET_SUFFIX = ".yaml"


def preset_files() -> list[Traversable]:
    """The YAML files of the built-in presets, sorted by name."""
    folder = resources.files("bertblocks") / "presets"
    return sorted((f for f in folder.iterdir() if f.is_file() and f.name.endswith(PRESET_SUFFIX)), key=lambda f: f.name)


def read_preset(file: Traversable) -> Preset:
    """One preset from its YAML file: the name is the file name, the description its first comment line.

    Raises:
        ValueError: the file is not YAML holding a mapping (names the file; a shipped preset never is).
    """
    name = file.name[: -len(PRESET_SUFFIX)]
    text = file.read_text(encoding="utf-8")
    config = parse_yaml(text, f"preset file {file.name}")  # a ReadError (a ValueError) naming the file and line
    if not isinstance(config, dict):
        raise InputError(f"preset file {file.name} must hold a mapping, got {type(config).__name__}")
    return Preset(name=name, config=config, description=_description(name, text))


def _description(name: str, text: str) -> str:
    first = text.splitlines()[0] if text else ""
    if not first.startswith("#"):
        return ""
    line = first.lstrip("#").strip()
    return line[len(name) + 1 :].strip() if line.startswith(f"{name}:") else line


def bertblocks_register_presets() -> list[Preset]:
    return [read_preset(f) for f in preset_files()]
