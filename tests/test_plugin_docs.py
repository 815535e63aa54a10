"""The plugin-author docs keep up with the code: every hook is documented with its signature, and the factory
arguments documented per kind are exactly those the builder passes."""

from __future__ import annotations

import copy
import inspect
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bertblocks import create_model
from bertblocks.core.component import KINDS, Component
from bertblocks.hf.families import get_family
from bertblocks.registry import Registry
from bertblocks.registry.hookspecs import PROJECT, BertBlocksHooks
from tests.conftest import TINY

DOCS = Path(__file__).parents[1] / "docs" / "plugins"
HOOKS_MD = (DOCS / "hooks.md").read_text()


def _hookspecs() -> list[str]:
    return [
        name
        for name, fn in inspect.getmembers(BertBlocksHooks, inspect.isfunction)
        if getattr(fn, f"{PROJECT}_spec", None) is not None
    ]


def _signature(name: str) -> str:
    """``bertblocks_register_components() -> list[Component]``, as the docs write it (``self`` dropped)."""
    sig = inspect.signature(getattr(BertBlocksHooks, name))  # annotations are strings (postponed evaluation)
    params = ", ".join(
        f"{p.name}: {p.annotation}" if p.annotation is not p.empty else p.name
        for p in sig.parameters.values()
        if p.name != "self"
    )
    return f"def {name}({params}) -> {sig.return_annotation}"


def test_there_are_hooks_to_document():
    assert "bertblocks_register_components" in _hookspecs()


@pytest.mark.parametrize("hook", _hookspecs())
def test_every_hook_is_documented_with_its_signature(hook):
    assert f"### `{hook}`" in HOOKS_MD, f"docs/plugins/hooks.md has no section for {hook}"
    section = HOOKS_MD.split(f"### `{hook}`", 1)[1].split("\n### ", 1)[0]
    assert _signature(hook) in section, f"the section of {hook} must show `{_signature(hook)}`"


def test_the_documented_hooks_exist():
    documented = set(re.findall(r"^### `(bertblocks_\w+)`", HOOKS_MD, flags=re.MULTILINE))
    assert documented == set(_hookspecs())


def _documented_arguments(kind: str) -> set[str]:
    heading = f"### Kind `{kind}`"
    assert heading in HOOKS_MD, f"docs/plugins/hooks.md has no factory-arguments section for kind {kind!r}"
    section = HOOKS_MD.split(heading, 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE)
    assert rows, f"the section for kind {kind!r} lists no arguments"
    return set(rows)


def _recorded_arguments() -> dict[str, set[str]]:
    """Build a backbone and a task model through factories that record the keywords they are called with."""
    seen: dict[str, set[str]] = defaultdict(set)
    builtins = Registry(load_entry_points=False)

    def spy(component: Component) -> Component:
        def factory(**kwargs: Any) -> Any:
            seen[component.kind].update(kwargs)
            return component.factory(**kwargs)

        return replace(component, factory=factory, provider="")

    class Spies:
        @staticmethod
        def bertblocks_register_components() -> list[Component]:
            return [spy(c) for c in builtins.components()]

    registry = Registry(load_entry_points=False, builtins=False)
    registry.register(Spies(), name="spies")
    config = copy.deepcopy(TINY)
    config.update({"is_decoder": True, "add_cross_attention": True})  # cross-attention: a second attention call
    create_model(config, registry=registry)
    create_model(TINY, head="sequence_classification", registry=registry)
    get_family("bert", registry)  # what loading and saving a config.json or checkpoint of `bert` calls
    return seen


RECORDED = _recorded_arguments()


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_documents_exactly_the_factory_arguments_it_gets(kind):
    assert kind in RECORDED, f"building a model never called a {kind} factory; extend _recorded_arguments"
    assert _documented_arguments(kind) == RECORDED[kind]


@pytest.mark.parametrize("page", ["writing-a-plugin.md", "hooks.md", "testing-a-plugin.md"])
def test_relative_links_between_plugin_pages_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (DOCS / target).resolve().exists(), f"{page} links to {target}, which does not exist"


def test_every_conformance_check_is_in_the_table():
    from bertblocks.testing import CHECKS

    table = (DOCS / "testing-a-plugin.md").read_text()
    for check in CHECKS:
        assert f"| `{check.name}`" in table, f"testing-a-plugin.md does not describe the {check.name} check"
