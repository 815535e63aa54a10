"""Imports point downwards only: core knows neither registry nor plugins; plugins do not know the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "bertblocks"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against the file's package
                package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ((base,) if base else ()))
            names.add(base)
    return names


#: packages and modules above the registry (old module names included: they are aliases of moved modules)
_ABOVE_REGISTRY = (
    "bertblocks.models",
    "bertblocks.hf",
    "bertblocks.config_files",
    "bertblocks.cli",
    "bertblocks.model",
    "bertblocks.checkpoint",
    "bertblocks.configuration",
)


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("core", ("bertblocks.registry", "bertblocks.plugins", *_ABOVE_REGISTRY)),
        ("plugins", ("bertblocks.registry", *_ABOVE_REGISTRY)),
        ("registry", _ABOVE_REGISTRY),
    ],
)
def test_layer_does_not_import_upwards(layer, forbidden):
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files
    offenders = {
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in _imports(path)
        if name.startswith(forbidden)
    }
    assert not offenders


def test_importing_bertblocks_builds_no_registry():
    import bertblocks.registry.manager as manager

    manager.set_registry(None)
    import bertblocks  # noqa: F401

    assert manager._default is None
