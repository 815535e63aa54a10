"""Robust plugin loading, with real (broken) packages: distributions written to a temporary directory with a
``*.dist-info`` (METADATA + entry_points.txt), found by ``importlib.metadata`` exactly as pip-installed ones.

Each broken plugin must be reported with its entry point, distribution and traceback, while the built-ins and
the example plugin (``bertblocks-alibi``, installed in the test set-up) keep working.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import bertblocks
from bertblocks import cli
from bertblocks.registry import (
    DISABLE_AUTOLOAD_ENV,
    DuplicateComponentError,
    PluginLoadError,
    Registry,
    UnknownComponentError,
    set_registry,
)
from tests.conftest import TINY, batch

BROKEN_IMPORT = "raise ImportError(\"broken_plugin needs the 'flash_kernels' package, which is not installed\")\n"
HOOK_RAISES = """
    def bertblocks_register_components():
        raise RuntimeError("raising_plugin: cannot find its kernel library")
"""
HOOK_GARBAGE = """
    def bertblocks_register_components():
        return {"backend": "not a list of components"}
"""
HOOK_BAD_SIGNATURE = """
    def bertblocks_register_components(config):
        return []
"""
HOOK_TYPO = """
    def bertblocks_register_component():
        return []
"""
EXITS = "import sys\nsys.exit(3)\n"
DUPLICATE_LOCAL = """
    from bertblocks.core.component import Component
    from bertblocks.core.interfaces import AttentionBackend

    def bertblocks_register_components():
        return [Component("backend", "local", lambda *, options: None)]
"""


class PluginDir:
    """Writes distributions into one directory on ``sys.path``, as ``pip install`` would lay them out."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def add(self, dist: str, version: str, module: str, source: str, entry: str | None = None) -> None:
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[bertblocks]\n{entry or module.removesuffix('_plugin')} = {module}\n")
        self.modules.append(module)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginDir]:
    """A site directory for throw-away distributions, with entry-point autoload switched back on."""
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))  # also invalidates import caches
    plugins = PluginDir(tmp_path)
    yield plugins
    for module in plugins.modules:
        sys.modules.pop(module, None)
    set_registry(None)


@pytest.fixture
def broken_site(plugin_dir: PluginDir) -> PluginDir:
    plugin_dir.add("broken-plugin", "1.0", "broken_plugin", BROKEN_IMPORT)
    plugin_dir.add("raising-plugin", "2.0", "raising_plugin", HOOK_RAISES)
    plugin_dir.add("garbage-plugin", "3.1", "garbage_plugin", HOOK_GARBAGE)
    return plugin_dir


def _error(reg: Registry, entry_point: str) -> PluginLoadError:
    found = [e for e in reg.load_errors if e.plugin.split(" = ")[0] == entry_point]
    assert len(found) == 1, [e.plugin for e in reg.load_errors]
    return found[0]


def _alibi_local_config() -> dict:
    config = {**TINY, "position": {"name": "alibi"}}
    config["encoder"] = {**TINY["encoder"], "attention": {"num_heads": 4, "backend": {"name": "local", "window": 2}}}
    return config


# ------------------------------------------------------------------------------------------ reporting
def test_a_plugin_that_fails_to_import_is_named_with_entry_point_distribution_and_traceback(broken_site):
    reg = Registry()
    error = _error(reg, "broken")
    assert error.plugin == "broken = broken_plugin"
    assert error.distribution == "broken-plugin 1.0"
    assert error.detail.startswith("Traceback (most recent call last):")
    assert str(broken_site.root / "broken_plugin.py") in error.detail  # the line that failed
    assert "ImportError: broken_plugin needs the 'flash_kernels' package" in error.detail
    assert str(error).startswith('Error loading plugin "broken = broken_plugin" (from broken-plugin 1.0):\nTraceback')


def test_a_hook_that_raises_or_returns_garbage_is_named_with_its_entry_point(broken_site):
    reg = Registry()
    raising = _error(reg, "raising")
    assert (raising.plugin, raising.distribution) == ("raising = raising_plugin", "raising-plugin 2.0")
    assert "raising_plugin.py" in raising.detail
    assert raising.detail.strip().endswith("RuntimeError: raising_plugin: cannot find its kernel library")
    garbage = _error(reg, "garbage")
    assert (garbage.plugin, garbage.distribution) == ("garbage = garbage_plugin", "garbage-plugin 3.1")
    assert "bertblocks_register_components must return a list of Component, got <class 'dict'>" in garbage.detail
    assert len(reg.load_errors) == 3


def test_hook_failures_are_reported_once_however_often_the_index_is_rebuilt(broken_site):
    reg = Registry()
    assert len(reg.load_errors) == 3
    # every registration invalidates the index, and the next look-up calls every hook again
    for i in range(2):
        reg.register(type("Empty", (), {})(), name=f"empty-{i}")
        assert reg.get("backend", "sdpa").name == "sdpa"
    assert sorted(e.plugin for e in reg.load_errors) == [
        "broken = broken_plugin",
        "garbage = garbage_plugin",
        "raising = raising_plugin",
    ]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (HOOK_BAD_SIGNATURE, "PluginValidationError"),  # pluggy refuses an argument the hook spec lacks
        (HOOK_TYPO, "bertblocks_register_component is not a bertblocks hook (did you mean "),
        (EXITS, "SystemExit: 3"),
    ],
    ids=["bad-signature", "misspelt-hook", "exits-on-import"],
)
def test_a_misbehaving_module_is_recorded_not_fatal(plugin_dir, source, expected):
    plugin_dir.add("odd-plugin", "0.3", "odd_plugin", source)
    reg = Registry()
    error = _error(reg, "odd")
    assert (error.plugin, error.distribution) == ("odd = odd_plugin", "odd-plugin 0.3")
    assert expected in error.detail
    assert reg.get("position", "alibi").provider == "alibi (bertblocks-alibi)"


def test_two_distributions_claiming_one_entry_point_name_are_both_named(plugin_dir):
    empty = "def bertblocks_register_components():\n    return []\n"
    plugin_dir.add("first-dist", "1.0", "first_plugin", empty, entry="same")
    plugin_dir.add("second-dist", "2.0", "second_plugin", empty, entry="same")
    reg = Registry()
    (error,) = [e for e in reg.load_errors if e.plugin.startswith("same = ")]
    loaded = next(p for p in reg.plugins() if p.name == "same")
    # which one wins depends on directory order; the report names the loser and the winner
    assert {error.distribution, f"{loaded.distribution} {loaded.version}"} == {"first-dist 1.0", "second-dist 2.0"}
    assert f"already taken by {loaded.distribution} {loaded.version}" in error.detail


# ------------------------------------------------------------------------------- everything else works
def test_other_plugins_keep_working_next_to_broken_ones(broken_site):
    reg = Registry()
    assert {p.name for p in reg.plugins()} >= {"alibi", "raising", "garbage"}  # "broken" never imported
    model = bertblocks.create_model(_alibi_local_config(), registry=reg).eval()
    with torch.no_grad():
        assert model(**batch()).last_hidden_state.shape == (3, 9, 32)


def test_a_config_needing_a_component_of_a_broken_plugin_fails_with_its_report(broken_site):
    reg = Registry()
    config = {**TINY, "position": "rotary"}
    config["encoder"] = {**TINY["encoder"], "attention": {"num_heads": 4, "backend": "flash"}}
    with pytest.raises(bertblocks.config.ConfigError) as info:
        bertblocks.load_config(config, registry=reg)
    issues = {issue.loc: issue.msg for issue in info.value.issues}
    assert set(issues) == {"position", "encoder.attention.backend"}
    for msg in issues.values():
        assert "plugins that failed to load (it may come from one of them)" in msg
        assert "broken = broken_plugin (broken-plugin 1.0): ImportError: broken_plugin needs" in msg
        assert "raising = raising_plugin (raising-plugin 2.0): RuntimeError: raising_plugin" in msg
    assert issues["encoder.attention.backend"].startswith("unknown backend 'flash'; available: eager, local, sdpa")
    with pytest.raises(UnknownComponentError, match=r"broken-plugin 1\.0"):
        reg.get("position", "rotary")


def test_the_cli_lists_broken_plugins_and_fails(broken_site, capsys):
    set_registry(None)
    assert cli.main(["plugins"]) != 0
    out = capsys.readouterr().out
    assert "FAILED  broken = broken_plugin (broken-plugin 1.0): ImportError" in out
    assert "bertblocks-alibi" in out


# ----------------------------------------------------------------------------- strict mode, env switch
def test_strict_mode_raises_at_construction(plugin_dir):
    plugin_dir.add("raising-plugin", "2.0", "raising_plugin", HOOK_RAISES)
    # a hook failure surfaces when the registry is made, not at some later look-up
    with pytest.raises(PluginLoadError, match=r'^Error loading plugin "raising = raising_plugin" \(from raising-'):
        Registry(strict=True)
    plugin_dir.add("broken-plugin", "1.0", "broken_plugin", BROKEN_IMPORT)
    with pytest.raises(PluginLoadError) as info:
        Registry(strict=True)
    assert info.value.plugin in {"broken = broken_plugin", "raising = raising_plugin"}


def test_the_environment_switch_skips_entry_points(broken_site, monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    reg = Registry()
    assert reg.load_errors == []
    assert {p.distribution for p in reg.plugins()} == {"bertblocks"}
    with pytest.raises(
        UnknownComponentError,
        match=r"^unknown position 'alibi'; available: absolute, disentangled, none, relative_bucket, relative_\w+",
    ):
        reg.get("position", "alibi")
    # strict mode has nothing to complain about when nothing is loaded
    assert Registry(strict=True).load_errors == []


def test_a_duplicate_from_an_installed_package_names_both_providers(plugin_dir):
    plugin_dir.add("dupe-plugin", "0.9", "dupe_plugin", DUPLICATE_LOCAL)
    reg = Registry()
    assert reg.get("backend", "sdpa").name == "sdpa"  # only the clashing name is an error
    with pytest.raises(DuplicateComponentError) as info:
        reg.get("backend", "local")
    message = str(info.value)
    assert message.startswith("backend 'local' is registered twice: by ")
    assert "alibi (bertblocks-alibi)" in message
    assert "dupe (dupe-plugin)" in message
    with pytest.raises(DuplicateComponentError, match="backend 'local' is registered twice"):
        Registry(strict=True)  # strict: the clash is an error at once


def test_an_in_process_plugin_needs_no_packaging(plugin_dir):
    plugin_dir.add("broken-plugin", "1.0", "broken_plugin", BROKEN_IMPORT)
    reg = Registry()
    made: list[torch.device] = []

    class InProcess:
        @staticmethod
        def bertblocks_register_components() -> list:
            from bertblocks_alibi import LocalAttentionBackend

            from bertblocks.core.component import Component, NoOptions

            def make(*, options: NoOptions) -> LocalAttentionBackend:
                made.append(torch.empty(0).device)  # meta while the model is measured, cpu when it is built
                return LocalAttentionBackend(window=1)

            return [Component("backend", "narrow", make, description="window 1")]

    reg.register(InProcess(), name="in-process")
    config = {**TINY, "encoder": {**TINY["encoder"], "attention": {"num_heads": 4, "backend": "narrow"}}}
    model = bertblocks.create_model(config, registry=reg)
    assert made.count(torch.device("cpu")) == TINY["encoder"]["num_layers"]
    assert model.encoder.layer[0].attention.backend.window == 1
    assert any(p.name == "in-process" and p.distribution == "(in-process)" for p in reg.plugins())
