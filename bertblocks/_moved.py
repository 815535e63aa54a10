"""Old import paths of modules that moved into packages, kept working.

``bertblocks.model`` is now :mod:`bertblocks.models.backbone`, ``bertblocks.checkpoint`` is
:mod:`bertblocks.hf.weights`, and so on (:data:`MOVED`). Importing an old name gives the *same module object*
as the new one (not a copy re-exporting its names), so ``from bertblocks.model import BertModel``,
``import bertblocks.checkpoint`` and ``monkeypatch.setattr("bertblocks.hub.…")`` keep their meaning.

Why a finder and not a thin module at each old path: a module left at the old path would turn every move
into "file changed + new file" for version control, and edits made elsewhere to the old file would no longer
follow it to its new place.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: old dotted name → where the module lives now
MOVED: dict[str, str] = {
    "bertblocks.checkpoint": "bertblocks.hf.weights",
    "bertblocks.hub": "bertblocks.hf.hub",
    "bertblocks.tokenizer": "bertblocks.hf.tokenizer",
    "bertblocks.configuration": "bertblocks.config_files",
    # the backbone, build_model and from_pretrained: models.auto holds all three (from_pretrained chooses
    # between the backbone and the task models, so it lives above both)
    "bertblocks.model": "bertblocks.models.auto",
    "bertblocks.task_model": "bertblocks.models.task_models",
    "bertblocks.encoder_decoder": "bertblocks.models.encoder_decoder",
    "bertblocks.generation": "bertblocks.models.generation",
    "bertblocks.loading": "bertblocks.models.meta_device",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new name (the same object, registered under both)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed when it was imported under its new name."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names in :data:`MOVED` (and nothing else)."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Make the old names importable (idempotent).

    The finder goes first: a stale file left at an old path (an older installation, an editable install of
    another checkout) must not shadow the module that moved.
    """
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def moved_attribute(name: str) -> ModuleType:
    """``bertblocks.<old name>`` as a package attribute (``bertblocks.model``), imported on first use.

    Raises:
        AttributeError: ``name`` is not an old module name.
    """
    target = MOVED.get(f"bertblocks.{name}")
    if target is None:
        raise AttributeError(f"module 'bertblocks' has no attribute {name!r}")
    return importlib.import_module(target)
