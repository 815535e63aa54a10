"""Imports point downwards only, and never in a circle.

Each top-level group of the package may import only the groups listed for it in :data:`MAY_IMPORT` (the table
of docs/explanation/architecture.md); no module takes part in an import cycle, counting imports inside
functions too; and ``core/`` names no transformers model class and no built-in component (other than the
schema's defaults, listed once in ``DEFAULT_COMPONENTS``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "bertblocks"

#: top-level group → the groups its modules may import (besides their own). Groups not listed here (cli,
#: ablation, zoo, sentence, introspect, testing, the package's __init__) sit on top and may import any group.
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    # every use of torch's private internals, behind a version gate (core's packing op and models' compile entry)
    "torch_internals": set(),
    # progress lines of slow steps on a terminal's stderr (the CLI's and the library's: one rule, one look)
    "progress": set(),
    # the one bounded reader per file format: every group that reads a file uses it
    "readers": {"errors"},
    "atomic": {"errors", "readers"},
    # config and core know no checkpoint format: neither imports hf (nor families), and neither reaches it
    # through a global something above installs (test_config_and_core_work_with_nothing_above_them)
    "config": {"errors", "readers"},
    "core": {"errors", "readers", "config", "torch_internals"},
    # the plugin manager registers the built-in plugins and families (neither imports the registry)
    "registry": {"errors", "readers", "config", "core", "plugins", "families"},
    "plugins": {"errors", "readers", "config", "core"},
    # the Family type, the key-map engine and one declarative module per family, BERT included
    "families": {"errors", "readers", "config", "core", "plugins"},
    "hf": {"errors", "readers", "atomic", "config", "core", "registry", "families"},
    "config_files": {"errors", "readers", "atomic", "config", "core", "registry", "hf"},
    "models": {
        "errors",
        "readers",
        "atomic",
        "config",
        "core",
        "registry",
        "families",
        "hf",
        "config_files",
        "torch_internals",
        "progress",
    },
}
#: the groups config/ and core/ must work without, at import and at run time
ABOVE_CONFIG_AND_CORE = ("registry", "plugins", "families", "hf", "config_files", "models")


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, package: Path = PACKAGE, modules: set[str] | None = None) -> set[str]:
    """Every bertblocks module ``path`` imports, at module level or inside functions (``if TYPE_CHECKING:``
    blocks left out: they never run). ``from pkg import name`` counts as importing ``pkg.name`` when that is a
    module."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    own = _module_name(path, package).split(".")
    own_package = own if is_package else own[:-1]
    skipped = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node) for n in ast.walk(node)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against the file's package
                anchor = own_package[: len(own_package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names}
            if modules is not None and submodules <= modules:
                names.update(submodules)  # `from . import report`: the module report, not the package
            else:
                names.add(base)
    return {name for name in names if name == package.name or name.startswith(f"{package.name}.")}


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = sorted(package.rglob("*.py"))
    modules = {_module_name(f, package) for f in files}
    graph = {}
    for path in files:
        # an import of a name inside a module (`from bertblocks.config import X`) is an edge to that module
        targets = set()
        for name in _imports(path, package, modules):
            while name not in modules and "." in name:
                name = name.rsplit(".", 1)[0]
            targets.add(name)
        graph[_module_name(path, package)] = targets - {_module_name(path, package)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_cycles_anywhere_in_the_package():
    assert _cycles(_graph()) == []


def test_the_cycle_check_sees_function_level_imports(tmp_path):
    # the shape of an old cycle (model.py imported task_model.py inside a function; task_model.py imported
    # model.py at the top): the check must see it
    package = tmp_path / "bertblocks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("def f():\n    from .task_model import g\n")
    (package / "task_model.py").write_text("from .model import f\n")
    (package / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .model import f\n")
    assert _cycles(_graph(package)) == [["bertblocks.model", "bertblocks.task_model"]]


@pytest.mark.parametrize("group", sorted(MAY_IMPORT))
def test_each_group_imports_only_the_groups_below_it(group):
    graph = _graph()
    modules = [m for m in graph if _group(m) == group]
    assert modules, group
    offenders = sorted(
        f"{module} imports {target}"
        for module in modules
        for target in graph[module]
        if _group(target) != group and _group(target) not in MAY_IMPORT[group]
    )
    assert offenders == []


def test_no_global_statement_in_config_or_core():
    # a module-level slot that a layer above fills at import (the old config.json translator behind
    # BertConfig.from_hf) is an upward dependency the import graph cannot see
    offenders = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for group in ("config", "core")
        for path in (PACKAGE / group).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    )
    assert offenders == []


def test_config_and_core_work_with_nothing_above_them():
    # every config/ and core/ module imported, and the config's transformers face used, in a process where
    # importing anything above them fails: what they need at run time, they import
    code = textwrap.dedent(
        f"""
        import importlib, importlib.abc, pkgutil, sys, types

        package = types.ModuleType("bertblocks")  # the package without its __init__, which imports everything
        package.__path__ = [{str(PACKAGE)!r}]
        sys.modules["bertblocks"] = package

        class Above(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                parts = name.split(".")
                if parts[0] == "bertblocks" and len(parts) > 1 and parts[1] in {ABOVE_CONFIG_AND_CORE!r}:
                    raise ImportError("config/core reached " + name)
                return None

        sys.meta_path.insert(0, Above())
        for group in ("config", "core"):
            module = importlib.import_module("bertblocks." + group)
            for info in pkgutil.walk_packages(module.__path__, module.__name__ + "."):
                importlib.import_module(info.name)
        from bertblocks.config import BertConfig

        encoder = {{"num_layers": 2, "attention": {{"num_heads": 4}}}}
        config = BertConfig(family="roberta", hidden_size=32, encoder=encoder)
        config.num_attention_heads = 8
        flat = config.to_dict()
        assert config.model_type == flat["model_type"] == "roberta", flat
        assert flat["num_hidden_layers"] == 2 and flat["num_attention_heads"] == 8, flat
        assert config.get("hidden_size") == 32 and config.to_json_string()
        assert not [m for m in sys.modules if m.split(".")[1:2] and m.split(".")[1] in {ABOVE_CONFIG_AND_CORE!r}]
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_importing_bertblocks_builds_no_registry():
    import bertblocks.registry.manager as manager

    manager.set_registry(None)
    import bertblocks  # noqa: F401

    assert manager._default is None


# ------------------------------------------------------------------------------- no HF knowledge in core
def _core_text() -> str:
    """core/ and config/: the layers below every component."""
    paths = [path for group in ("core", "config") for path in sorted((PACKAGE / group).rglob("*.py"))]
    return "\n".join(path.read_text() for path in paths)


def test_core_names_no_transformers_model_class():
    transformers = pytest.importorskip("transformers")
    # model classes (BertModel, BertForMaskedLM, BertLMHeadModel, …). Output containers (…Output) keep
    # transformers' names on purpose: they are the forward contract users read fields from.
    candidates = set(re.findall(r"\b[A-Z][A-Za-z0-9]*(?:Model|For[A-Z][A-Za-z]*)\b", _core_text()))
    named = sorted(name for name in candidates if not name.endswith("Output") and hasattr(transformers, name))
    assert named == []


def test_core_names_no_builtin_component_but_the_schema_defaults():
    from bertblocks.config import DEFAULT_COMPONENTS
    from bertblocks.registry import Registry

    builtins = {c.name for c in Registry(load_entry_points=False).components()}
    assert set(DEFAULT_COMPONENTS.values()) <= builtins  # the defaults exist
    text = _core_text()
    table = re.search(r"DEFAULT_COMPONENTS: dict\[str, str\] = \{.*?\n\}", text, re.S)
    assert table is not None
    rest = text.replace(table.group(0), "")
    # `none` is also a plain word of the config language (limits: `none` switches a limit off), not only the
    # position scheme of that name, so its appearance in core says nothing about core knowing the component
    plain_words = {"none"}
    mentioned = sorted(
        name for name in builtins - plain_words if re.search(rf"(``|[\"']){re.escape(name)}(``|[\"'])", rest)
    )
    assert mentioned == []


# ------------------------------------------------------------------------------- core holds interfaces only
def _core_classes() -> list[tuple[str, type]]:
    """Every class defined in a core/ module, as ``(dotted name, class)``."""
    import importlib
    import pkgutil

    import bertblocks.core as core

    found = []
    for info in pkgutil.walk_packages(core.__path__, f"{core.__name__}."):
        module = importlib.import_module(info.name)
        found += [
            (f"{module.__name__}.{name}", value)
            for name, value in vars(module).items()
            if isinstance(value, type) and value.__module__ == module.__name__
        ]
    return found


def test_core_holds_no_concrete_component():
    """The interfaces every kind's contract names (``CONTRACTS``' returned types) are core's; an implementation
    of one (BERT's post-LN layer, say) is a plugin's, however central."""
    from torch import nn

    from bertblocks.core.factories import CONTRACTS

    interfaces = {contract.returns for contract in CONTRACTS.values()} - {nn.Module}
    assert len(interfaces) >= 8  # embedding, position, attention, backend, feedforward, layer, pooler, head
    concrete = sorted(
        name
        for name, cls in _core_classes()
        if cls not in interfaces and any(issubclass(cls, interface) for interface in interfaces)
    )
    assert concrete == []


def test_core_initialises_no_weights():
    # Hugging Face's initialisation rule names concrete layers (nn.Linear, nn.Embedding, …): it is the models'
    # (bertblocks/models/weight_init.py), not core's
    offenders = sorted(
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in sorted((PACKAGE / "core").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.normal_\(|\bnn\.init\.|reset_parameters_like_hf", line)
    )
    assert offenders == []
