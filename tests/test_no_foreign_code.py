"""No code from a checkpoint, tokenizer or pipeline folder ever runs, on any loading path.

Each test loads a folder with planted Python modules (``configuration_evil.py``, ``modeling_evil.py``,
``tokenization_evil.py``) that ``config.json`` and ``tokenizer_config.json`` name through ``auto_map``, as a
Hub repository with custom code does. A planted module appends its name to a marker file when imported; the
marker must stay absent and no planted module may appear in ``sys.modules``. The last tests scan the package
source for the calls that would open such a hole again.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from torch.testing import assert_close

import bertblocks
from bertblocks import BertModel, BertTokenizer, cli
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import RemoteClassesIgnoredWarning
from tests.conftest import TINY

PLANTED = ("configuration_evil", "modeling_evil", "tokenization_evil", "evil_activation")
PACKAGE = Path(bertblocks.__file__).parent


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("bertblocks").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """The file a planted module writes when imported; checked after the test."""
    path = tmp_path / "IMPORTED"
    yield path
    assert not path.exists(), f"planted code ran: {path.read_text()}"
    assert not [name for name in PLANTED if name in sys.modules]


def plant(directory: Path, marker: Path, model_classes: bool = False, field: bool = True) -> Path:
    """Add planted modules to ``directory`` and name them in its config.json and tokenizer_config.json.

    With ``model_classes``, config.json's ``auto_map`` names a config and model class, and (``field``) the file holds
    a field of that code the family does not read (so bertblocks refuses to build it as the plain ``model_type``);
    without, only a tokenizer class, as such repositories also do.
    """
    for name in PLANTED:
        (directory / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n"
            "import torch\n\n\nclass Evil(torch.nn.Module):\n    pass\n",
            encoding="utf-8",
        )
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.Evil", None]}
    if model_classes:
        config["auto_map"] |= {
            "AutoConfig": "configuration_evil.Evil",
            "AutoModel": "modeling_evil.Evil",
            "AutoModelForMaskedLM": "modeling_evil.Evil",
        }
        if field:
            config["evil_attention"] = "sparse"
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():
        settings = json.loads(tokenizer_config.read_text())
        settings["auto_map"] = {"AutoTokenizer": ["tokenization_evil.Evil", None]}
        tokenizer_config.write_text(json.dumps(settings))
    return directory


@pytest.fixture
def checkpoint(tmp_path: Path, marker: Path) -> Path:
    """A tiny BERT checkpoint with a WordPiece tokenizer, planted."""
    directory = tmp_path / "ckpt"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]
    vocab += [f"[unused{i}]" for i in range(TINY["vocab_size"] - len(vocab))]
    BertTokenizer.from_vocab(vocab, model_max_length=64).save_pretrained(directory)
    torch.manual_seed(0)
    bertblocks.create_model(TINY).save_pretrained(directory)
    return plant(directory, marker)


@pytest.fixture
def remote_checkpoint(checkpoint: Path, marker: Path) -> Path:
    """The checkpoint, its config.json naming planted config and model classes."""
    return plant(checkpoint, marker, model_classes=True)


@pytest.fixture
def remote_classes_only(checkpoint: Path, marker: Path) -> Path:
    """The checkpoint, its config.json naming planted config and model classes over fields BERT reads only (as
    bge-reranker-v2-m3 names XLMRobertaFlash classes over XLM-R's fields)."""
    return plant(checkpoint, marker, model_classes=True, field=False)


# ------------------------------------------------------------------------------------- models, configs
@pytest.mark.parametrize("head", ["auto", None, "masked_lm"])
def test_from_pretrained_refuses_remote_model_classes_without_importing_them(remote_checkpoint, head):
    with pytest.raises(ConfigError, match=r"auto_map: names remote-code classes \(configuration_evil.Evil") as e:
        bertblocks.from_pretrained(remote_checkpoint, head=head)
    assert "fields the family does not read (evil_attention)" in str(e.value)


@pytest.mark.parametrize("head", ["auto", None])
def test_remote_classes_over_fields_the_family_reads_load_with_a_warning_without_importing_them(
    remote_classes_only, head
):
    config = json.loads((remote_classes_only / "config.json").read_text())
    plain = {key: value for key, value in config.items() if key != "auto_map"}
    with pytest.warns(RemoteClassesIgnoredWarning, match=r"names remote-code classes \(configuration_evil.Evil, mod"):
        model = bertblocks.from_pretrained(remote_classes_only, head=head)
    (remote_classes_only / "config.json").write_text(json.dumps(plain))
    reference = bertblocks.from_pretrained(remote_classes_only, head=head)
    ids = torch.randint(5, TINY["vocab_size"], (2, 7))
    assert_close(model.eval()(ids).last_hidden_state, reference.eval()(ids).last_hidden_state, rtol=0, atol=0)


def test_load_config_and_commands_refuse_remote_model_classes(remote_checkpoint, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"modeling_evil\.Evil"):
        bertblocks.load_config(remote_checkpoint / "config.json")
    with pytest.raises(ConfigError, match=r"modeling_evil\.Evil"):
        BertModel.from_pretrained(remote_checkpoint, trust_remote_code=True)
    assert cli.main(["export", str(remote_checkpoint), str(tmp_path / "model.pt2")]) != 0
    assert "auto_map: names remote-code classes" in capsys.readouterr().err


@pytest.mark.parametrize("head", ["auto", None, "masked_lm"])
def test_from_pretrained_ignores_auto_map(checkpoint, head):
    model = bertblocks.from_pretrained(checkpoint, head=head)
    assert model.config.hidden_size == TINY["hidden_size"]


def test_load_config_of_a_planted_config_json(checkpoint):
    assert bertblocks.load_config(checkpoint / "config.json").hidden_size == TINY["hidden_size"]


def test_unknown_model_type_with_auto_map_is_a_clear_error(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "model_type": "evil", "architectures": ["Evil"]}))
    with pytest.raises(ConfigError, match="no model family handles 'evil'"):
        bertblocks.from_pretrained(checkpoint, head="auto")


def test_trust_remote_code_keyword_changes_nothing(checkpoint):
    """transformers-style callers pass it; bertblocks reads no code either way."""
    model = BertModel.from_pretrained(checkpoint, trust_remote_code=True)
    assert type(model) is BertModel


# ------------------------------------------------------------------------------------------ tokenizers
def test_bertblocks_tokenizer_ignores_auto_map(checkpoint):
    assert BertTokenizer.from_pretrained(checkpoint)(["abc"])["input_ids"][0][0] == 2  # [CLS]


def test_the_sentence_transformers_module_tokenizer_ignores_auto_map(checkpoint):
    from bertblocks.integrations.sentence_transformers import BertblocksModule

    module = BertblocksModule(checkpoint)
    assert type(module.tokenizer).__module__.startswith("transformers.")


# ------------------------------------------------------------------------------------------- pipelines
@pytest.fixture
def pipeline_folder(tmp_path: Path, checkpoint: Path, marker: Path) -> Path:
    """A saved SentenceTransformer (bertblocks module, Pooling, Dense, Normalize), planted."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    from bertblocks.integrations.sentence_transformers import BertblocksModule

    encoder = BertblocksModule(checkpoint)
    modules = [encoder, Pooling(32, "mean"), Dense(32, 8), Normalize()]
    folder = tmp_path / "pipeline"
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return plant(folder, marker)


def _set_module_type(folder: Path, index: int, module_type: str) -> None:
    """Make entry ``index`` a ``module_type`` that loads from the folder root (config.json, auto_map)."""
    modules = json.loads((folder / "modules.json").read_text())
    modules[index].update(type=module_type, path="")
    (folder / "modules.json").write_text(json.dumps(modules))


def test_load_pipeline_loads_a_planted_folder_without_importing_it(pipeline_folder):
    from bertblocks.integrations.sentence_transformers import BertblocksModule, load_pipeline

    loaded = load_pipeline(pipeline_folder, device="cpu")
    assert isinstance(loaded[0], BertblocksModule)
    assert loaded.encode(["abc def"]).shape == (1, 8)


@pytest.mark.parametrize(
    "module_type",
    [
        "modeling_evil.Evil",  # the folder's own code
        "sentence_transformers.sentence_transformer.modules.Transformer",  # would load AutoModel from the folder
        "sentence_transformers.util.misc.import_from_string",  # inside the namespace, but not a module
    ],
)
def test_load_pipeline_refuses_types_outside_the_allow_list(pipeline_folder, module_type):
    from bertblocks.integrations.sentence_transformers import UntrustedPipelineError, load_pipeline

    _set_module_type(pipeline_folder, 1, module_type)
    with pytest.raises(UntrustedPipelineError, match=re.escape(f"outside bertblocks' allow-list: [{module_type!r}]")):
        load_pipeline(pipeline_folder)


def test_load_pipeline_never_takes_trust_remote_code(pipeline_folder):
    from bertblocks.integrations.sentence_transformers import load_pipeline

    with pytest.raises(TypeError, match="takes no trust_remote_code"):
        load_pipeline(pipeline_folder, trust_remote_code=True)


def test_a_dense_activation_naming_an_importable_module_is_not_imported(pipeline_folder, monkeypatch):
    """sentence-transformers imports ``activation_function`` by name when it is given trust_remote_code."""
    from bertblocks.integrations.sentence_transformers import load_pipeline

    monkeypatch.syspath_prepend(str(pipeline_folder))  # the planted module is importable by name
    settings_file = pipeline_folder / "2_Dense" / "config.json"
    settings = json.loads(settings_file.read_text())
    settings["activation_function"] = "evil_activation.Evil"
    settings_file.write_text(json.dumps(settings))
    load_pipeline(pipeline_folder, device="cpu")  # sentence-transformers falls back to its default


def test_load_pipeline_refuses_malformed_modules_json(tmp_path):
    from bertblocks.integrations.sentence_transformers import UntrustedPipelineError, load_pipeline

    (tmp_path / "modules.json").write_text('{"type": "x"}')
    with pytest.raises(UntrustedPipelineError, match="expected a list of module entries"):
        load_pipeline(tmp_path)


# --------------------------------------------------------------------------------------- command line
def test_embed_command_on_a_planted_checkpoint(checkpoint, tmp_path, capsys):
    (tmp_path / "texts.txt").write_text("abc\ndef gh\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    code = cli.main(["embed", "--model", str(checkpoint), "--input", str(tmp_path / "texts.txt"), "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    assert out.is_file()


def test_export_command_on_a_planted_checkpoint(checkpoint, tmp_path, capsys):
    code = cli.main(["export", str(checkpoint), str(tmp_path / "model.pt2"), "--head", "none"])
    assert code == 0, capsys.readouterr().err


def test_ablate_with_a_planted_config_json_as_base(checkpoint, tmp_path, capsys):
    study = {
        "name": "planted",
        "base": str(checkpoint / "config.json"),
        "vary": {"position.name": ["absolute", "relative_key"]},
        "measure": {"batch": 2, "seq_len": 8, "metrics": ["params"]},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    code = cli.main(["ablate", str(tmp_path / "study.yaml"), "--out", str(out), "--workers", "0", "--no-progress"])
    assert code == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------------ the package source
def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def _name(node: ast.expr) -> str:
    """``torch.load`` for ``torch.load(...)``'s function, ``eval`` for ``eval(...)``."""
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _keyword(call: ast.Call, name: str) -> object:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value.value if isinstance(keyword.value, ast.Constant) else keyword.value
    return None


#: calls that run code, or unpickle, or build arbitrary objects from their input
RUNS_CODE = frozenset(
    {"eval", "exec", "compile", "__import__", "runpy.run_path", "runpy.run_module"}
    | {"pickle.load", "pickle.Unpickler", "dill.load", "cloudpickle.load", "marshal.load", "torch.jit.load"}
    | {"yaml.load", "yaml.unsafe_load", "yaml.full_load", "np.load", "numpy.load"}
)


def _holes(path: Path, root: Path = PACKAGE.parent) -> list[tuple[str, str]]:
    """``(file, what)`` for each call in ``path`` that could run code a file names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(root).as_posix()
    found = []
    for call in _calls(tree):
        name = _name(call.func)
        if name in RUNS_CODE:
            found.append((where, name))
        elif name == "torch.load" and _keyword(call, "weights_only") is not True:
            found.append((where, "torch.load without weights_only=True"))
        elif _keyword(call, "trust_remote_code") is True:
            found.append((where, f"{name} with trust_remote_code=True"))
        elif name.endswith(("import_module", "spec_from_file_location", "get_class_from_dynamic_module")):
            found.append((where, name))
    return found


#: the package's own dynamic imports, none of which reads a name from a file: the built-in command modules
#: (a constant tuple), a command's ``module:function`` target (registered in code, by a plugin), and the
#: ablation package's lazy public names (a constant table of its own submodules)
ALLOWED = [
    *[("bertblocks/cli/__init__.py", "importlib.import_module")] * 2,
    ("bertblocks/ablation/__init__.py", "importlib.import_module"),
]


def test_the_package_never_imports_or_unpickles_what_a_file_names():
    holes = [hole for path in sorted(PACKAGE.rglob("*.py")) for hole in _holes(path)]
    assert sorted(holes) == sorted(ALLOWED)  # a new entry needs a reason next to ALLOWED; a removed one too


def test_the_source_scan_finds_a_planted_hole(tmp_path):
    """The scan above can fail: each pattern it looks for is found in a planted file."""
    source = tmp_path / "holes.py"
    source.write_text(
        "import torch, pickle, importlib, yaml\n"
        "torch.load('x')\n"
        "torch.load('x', weights_only=False)\n"
        "pickle.load(f)\n"
        "eval('1')\n"
        "yaml.load(text)\n"
        "importlib.import_module(name)\n"
        "AutoModel.from_pretrained('x', trust_remote_code=True)\n"
        "torch.load('x', weights_only=True)\n"
        "yaml.safe_load(text)\n",
        encoding="utf-8",
    )
    assert [what for _, what in _holes(source, tmp_path)] == [
        "torch.load without weights_only=True",
        "torch.load without weights_only=True",
        "pickle.load",
        "eval",
        "yaml.load",
        "importlib.import_module",
        "AutoModel.from_pretrained with trust_remote_code=True",
    ]
