"""Every error bertblocks raises on purpose derives from BertBlocksError, and the command line tells those (exit 1,
one line) from bugs (exit 4) by that base alone."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import bertblocks
from bertblocks import cli
from bertblocks.errors import BertBlocksError

#: exception classes that are not errors: control flow, never shown to a user as a failure
NOT_ERRORS = {"bertblocks.testing.subject.ConformanceSkip", "bertblocks.ablation.interrupts.RunInterrupted"}


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a bertblocks module (warnings are not errors), by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(bertblocks.__path__, "bertblocks."):
        if info.name.endswith("__main__"):  # runs the command line on import
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and not issubclass(obj, Warning)
                and obj.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_error_class_of_the_package_derives_from_bertblocks_error():
    classes = _exception_classes()
    assert len(classes) > 20  # the walk found the package's errors (config, registry, checkpoints, CLI, ...)
    assert set(NOT_ERRORS) <= set(classes)  # the exemptions still exist
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, BertBlocksError))
    assert outside == sorted(NOT_ERRORS)


@pytest.mark.parametrize(
    "error",
    [
        type("SomeNewError", (BertBlocksError, ValueError), {})("what was refused, and where"),
        bertblocks.config.ConfigError([], "x.yaml"),
    ],
)
def test_the_cli_reports_any_bertblocks_error_as_invalid_input_in_one_line(error, capsys, monkeypatch):
    def refuse(args):
        raise error

    monkeypatch.setitem(cli.SUBCOMMANDS, "refuse", cli.Subcommand("refuse", "test", lambda p: None, refuse))
    assert cli.main(["refuse"]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"bertblocks refuse: error: {str(error).splitlines()[0]}")
    assert "bug" not in err
    assert "Traceback" not in err


@pytest.mark.parametrize("error", [ValueError("shape"), FileNotFoundError(2, "gone", "x"), KeyError("k")])
def test_the_cli_reports_any_other_exception_as_a_bug(error, capsys, monkeypatch):
    def crash(args):
        raise error

    monkeypatch.setitem(cli.SUBCOMMANDS, "crash", cli.Subcommand("crash", "test", lambda p: None, crash))
    assert cli.main(["crash"]) == cli.EXIT_INTERNAL
    assert "this is a bug" in capsys.readouterr().err


# ------------------------------------------------------------------------ every raise site, by construction
#: the ``raise``/``assert`` sites that may stay what they are, keyed by (module, source of the statement's
#: exception or test) so that lines moving does not break the list; each says why it is no refused input
ALLOWED: dict[tuple[str, str], str] = {
    # abstract methods: a subclass that forgets one is a bug in that subclass, never an input
    ("bertblocks.models.pretrained", "NotImplementedError"): "abstract method of the task-model base",
    # torch's own protocol inside a fake (meta) kernel: torch.compile catches this very type
    ("bertblocks.torch_internals", "torch._subclasses.fake_tensor.DynamicOutputShapeException(op)"): (
        "torch's signal for a data-dependent shape"
    ),
    # asserts that narrow an Optional for the type checker after the value was checked or set a few lines up
    # (python -O strips them, so none may stand for a check of an input)
    ("bertblocks.config.schema", "self.id2label is not None"): "set by the validator above",
    ("bertblocks.sentence", "embeddings is not None"): "the loop above ran at least once (texts checked)",
    ("bertblocks.models.surface", "isinstance(self, nn.Module)"): "a mixin of nn.Module classes only",
    ("bertblocks.plugins.heads.retrieval", "hidden is not None"): "the backbone always returns its last hidden state",
    ("bertblocks.models.encoder_decoder", "decoder_cfg.head is not None"): "decoder_config sets a causal-LM head",
    ("bertblocks.ablation.study", "self.kind is not None"): "filled in by the validator above",
    ("bertblocks.ablation.runner", "study.spec.train is not None"): "called only for studies that train",
    ("bertblocks.ablation.data", "corpus.path is not None"): "kind: file has a path (validated)",
    ("bertblocks.ablation.data", "train is not None"): "called only for studies that train",
    ("bertblocks.ablation.downstream", "best is not None"): "the rate grid is non-empty (validated), so one won",
    ("bertblocks.ablation.training", "best is not None"): "the rate grid is non-empty (validated), so one won",
    ("bertblocks.ablation.training", "flops_per_token is not None"): "a flops budget is refused without it above",
    ("bertblocks.ablation.data", "labels is not None"): "classification corpora carry labels (validated)",
    ("bertblocks.ablation.downstream", "task.data is not None"): "prepared before any run",
    ("bertblocks.ablation.run", "task.data is not None"): "studies that train carry their tensors",
    ("bertblocks.core.encoder", "inputs_embeds is not None"): "exactly one of the two was checked above",
    ("bertblocks.plugins.embeddings", "input_ids is not None"): "exactly one of the two was checked above",
    ("bertblocks.plugins.embeddings", "pad is not None"): "padding offsets are built only with a pad id",
    ("bertblocks.plugins.embeddings", "self.padding_idx is not None"): "checked at build",
    ("bertblocks.plugins.heads.pooling", "hidden is not None"): "the backbone always returns its hidden states",
    ("bertblocks.families.keymap", "ckpt is not None"): "the loop above matched a name",
}

BUILTIN_EXCEPTIONS = {
    name
    for name, obj in vars(builtins).items()
    if inspect.isclass(obj) and issubclass(obj, BaseException) and not issubclass(obj, Warning)
}


def _resolve(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """The object ``node`` (a name or a dotted attribute) names in a module's namespace, or None (a local)."""
    if isinstance(node, ast.Name):
        if node.id in namespace:
            return namespace[node.id]
        return getattr(builtins, node.id, None)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, namespace)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _not_ours(obj: Any) -> bool:
    """Whether ``obj`` is an exception class that is no BertBlocksError (a warning, or one of :data:`NOT_ERRORS`,
    is no error)."""
    return (
        inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and not issubclass(obj, (BertBlocksError, Warning))
        and f"{obj.__module__}.{obj.__qualname__}" not in NOT_ERRORS
    )


def _returns_not_ours(func: Any) -> bool:
    """Whether a helper that builds the raised error (``raise _refuse(...)``) is annotated to return a foreign one."""
    try:
        return _not_ours(typing.get_type_hints(func).get("return"))
    except Exception:  # not a function, or an annotation that does not resolve: the call check covers it
        return False


def raise_site_violations(source: str, module: str, namespace: dict[str, Any]) -> list[str]:
    """Every statement in ``source`` (module ``module``, globals ``namespace``) that raises, builds or asserts
    an error that is no BertBlocksError, and is not in :data:`ALLOWED`:

    - ``raise X`` / ``raise X(...)`` where X is a built-in exception (``ValueError``, ``KeyError``, …) or any
      other exception class not derived from BertBlocksError (a third party's);
    - ``raise helper(...)`` where the helper is annotated to return such a class;
    - a call that builds such an exception anywhere (``error = ValueError(...)``, then ``raise error``);
    - ``assert`` (stripped by ``python -O``; an internal invariant must be listed with its reason).
    """
    tree = ast.parse(source)
    found = []

    def flag(node: ast.AST, key: str, what: str) -> None:
        if (module, key) not in ALLOWED:
            found.append(f"{module}:{node.lineno}: {what}")

    raised_calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc
            target = exc.func if isinstance(exc, ast.Call) else exc
            if isinstance(exc, ast.Call):
                raised_calls.add(id(exc))
            obj = _resolve(target, namespace)
            shadowed = isinstance(target, ast.Name) and target.id in namespace
            builtin = isinstance(target, ast.Name) and target.id in BUILTIN_EXCEPTIONS and not shadowed
            if builtin or _not_ours(obj) or (isinstance(exc, ast.Call) and _returns_not_ours(obj)):
                flag(node, ast.unparse(exc), f"raise {ast.unparse(exc)[:80]}")
        elif isinstance(node, ast.Assert):
            flag(node, ast.unparse(node.test), f"assert {ast.unparse(node.test)[:80]}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in raised_calls:
            target = node.func
            builtin = isinstance(target, ast.Name) and target.id in BUILTIN_EXCEPTIONS and target.id not in namespace
            if builtin or _not_ours(_resolve(target, namespace)):
                flag(node, ast.unparse(node), f"builds {ast.unparse(node)[:80]}")
    return found


def _package_modules() -> list[ModuleType]:
    modules = []
    for info in pkgutil.walk_packages(bertblocks.__path__, "bertblocks."):
        if info.name.endswith("__main__"):  # runs the command line on import
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def test_no_module_raises_a_builtin_or_foreign_exception_for_a_bad_input():
    """Every deliberate error is a BertBlocksError, whatever module raises it: the command line's exit 4 ("a bug")
    is then never a refused input. The walk reads every module of the package, so a new one is checked on arrival."""
    modules = _package_modules()
    assert len(modules) > 100
    found, seen = [], set()
    for module in modules:
        path = Path(module.__file__ or "")
        if path.suffix != ".py":
            continue
        found += raise_site_violations(path.read_text(encoding="utf-8"), module.__name__, vars(module))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                seen.add((module.__name__, ast.unparse(node.exc)))
            elif isinstance(node, ast.Assert):
                seen.add((module.__name__, ast.unparse(node.test)))
    assert found == []
    stale = sorted(set(ALLOWED) - seen)
    assert stale == [], "ALLOWED names sites that no longer exist; remove them"


PLANTED = """
import yaml
from bertblocks.errors import InputError

class Model:
    def forward(self, ids, mask, width):
        if ids is None:
            raise ValueError("ids missing")                 # a plain built-in: the old bug
        if mask is None:
            raise KeyError                                  # bare class
        if width < 0:
            error = TypeError("width")                      # built here, raised below
            raise error
        if width > 10:
            raise yaml.YAMLError("not ours either")         # a third party's exception for our input
        assert width != 3, "three is refused"               # validation by assert: gone under python -O
        if width == 4:
            raise InputError("width 4 is refused")          # fine: a BertBlocksError (and a ValueError)
"""


def test_the_raise_site_walk_catches_a_planted_builtin_raise():
    import yaml

    from bertblocks.errors import InputError

    found = raise_site_violations(PLANTED, "planted", {"yaml": yaml, "InputError": InputError})
    lines = sorted(int(f.split(":")[1]) for f in found)
    assert lines == [8, 10, 12, 15, 16], found  # every bad site named with its line, the InputError not


def test_did_you_mean_names_the_closest_candidate_or_nothing():
    from bertblocks.errors import close_matches, did_you_mean

    assert did_you_mean("sdpaa", ["eager", "sdpa", "flex"]) == " (did you mean 'sdpa'?)"
    assert did_you_mean("zzz", ["eager", "sdpa"]) == ""  # nothing close: no hint rather than a wild guess
    assert did_you_mean("x", []) == ""
    assert did_you_mean("bertblocks_hooks", ["bertblocks_hook"], cutoff=0.99) == ""  # a stricter caller's cutoff
    assert close_matches("bert-bas", ["bert-base", "bert-large", "gpt"], n=2) == ["bert-base", "bert-large"]
    assert close_matches("bert", iter(["bert"])) == ["bert"]  # any iterable, read once


def _builds_its_own_hint(source: str) -> list[str]:
    """Lines of ``source`` that look names up with difflib or spell out the hint: both belong to
    :func:`bertblocks.errors.did_you_mean` alone."""
    return [
        f"{number}: {line.strip()}"
        for number, line in enumerate(source.splitlines(), 1)
        if re.search(r"\bimport difflib|\bfrom difflib|get_close_matches|did you mean \{", line)
    ]


def test_the_did_you_mean_hint_is_built_in_one_place():
    """Every "unknown name" message gets its hint from errors.did_you_mean / close_matches, so the wording and
    the closeness rule are the same everywhere; the walk reads every module, a new one included."""
    found = {}
    for path in sorted(Path(bertblocks.__file__).parent.rglob("*.py")):
        if path.name == "errors.py" and path.parent == Path(bertblocks.__file__).parent:
            continue
        lines = _builds_its_own_hint(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(Path(bertblocks.__file__).parent))] = lines
    assert found == {}
    planted = 'import difflib\nhint = difflib.get_close_matches(name, known)\nmsg += f" (did you mean {hint!r}?)"\n'
    assert [line.split(":")[0] for line in _builds_its_own_hint(planted)] == ["1", "2", "3"]
