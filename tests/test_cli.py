"""The ``bertblocks`` command line: every command's output and exit code, run in-process through ``main(argv)``,
bad input of each kind, and one run of the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import bertblocks
from bertblocks import cli
from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.registry import Registry, set_registry
from tests.conftest import TINY
from tests.tolerances import assert_close


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tiny_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    return path


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ build
def test_build_prints_tree_and_counts_that_match_the_model(capsys, tiny_yaml):
    code, out, err = run(capsys, "build", str(tiny_yaml))
    assert code == 0, err
    model = bertblocks.create_model(tiny_yaml)
    unique = sum(p.numel() for p in model.parameters())
    assert f"Unique params: {unique:,}" in out
    assert f"Total params (counted per module): {unique:,}" in out  # nothing is tied in a backbone
    # every layer is the same: one collapsed row, with the per-layer count of the real module
    per_layer = sum(p.numel() for p in model.encoder.layer[0].parameters())
    assert "layer.0-1: TransformerLayer ×2" in out
    assert f"{per_layer:,} each" in out
    word = model.embeddings.word_embeddings.weight.numel()
    assert any("word_embeddings: Embedding" in line and line.endswith(f"{word:,}") for line in out.splitlines())
    assert "attention: BertAttention[sdpa]" in out


def test_build_json_and_set_override(capsys, tiny_yaml):
    code, out, _ = run(capsys, "build", str(tiny_yaml), "--json", "--set", "encoder.attention.backend=eager")
    assert code == 0
    data = json.loads(out)
    model = bertblocks.create_model(tiny_yaml)
    assert data["parameters"]["unique"] == sum(p.numel() for p in model.parameters())
    assert data["config"]["encoder"]["attention"]["backend"]["name"] == "eager"
    types = {row["path"]: row["type"] for row in data["modules"]}
    assert types["encoder.layer.0.attention"] == "BertAttention[eager]"


def test_build_preset_by_name(capsys):
    code, out, err = run(capsys, "--json", "build", "bert-tiny-uncased")
    assert code == 0, err
    data = json.loads(out)
    preset = bertblocks.load_config("bert-tiny-uncased")
    with torch.device("meta"):
        expected = sum(p.numel() for p in bertblocks.create_model(preset).parameters())
    assert data["parameters"]["unique"] == expected


def test_build_depth_limits_the_tree(capsys, tiny_yaml):
    code, out, _ = run(capsys, "build", str(tiny_yaml), "--depth", "1", "--json")
    assert code == 0
    assert {row["depth"] for row in json.loads(out)["modules"]} == {0, 1}


# --------------------------------------------------------------------------------------------- validate
def test_validate_ok(capsys, tiny_yaml):
    code, out, _ = run(capsys, "validate", str(tiny_yaml))
    assert code == 0
    assert out.startswith(f"ok: {tiny_yaml} is a valid config (2 layers, hidden 32, 4 heads")


def test_validate_show_prints_every_value(capsys, tiny_yaml):
    code, out, _ = run(capsys, "validate", str(tiny_yaml), "--show")
    assert code == 0
    shown = yaml.safe_load(out.split("\n", 1)[1])
    assert BertConfig.model_validate(shown) == bertblocks.load_config(tiny_yaml)
    assert shown["layer_norm_eps"] == 1e-12  # a default, printed although the file does not set it


def test_validate_reports_every_error_with_dotted_paths(capsys, tmp_path):
    bad = write(
        tmp_path / "bad.yaml",
        "hidden_size: 30\n"
        "encoder:\n"
        "  num_layers: 2\n"
        "  attention: {num_heads: 4, backend: sdpx}\n"
        "  feedforward: {activation: gelu, intermediate_sise: 8}\n",
    )
    code, out, err = run(capsys, "validate", str(bad))
    assert code == 1
    assert out == ""
    assert "encoder.attention.num_heads: must divide hidden_size 30" in err
    assert "encoder.attention.backend: unknown backend 'sdpx'" in err
    assert "did you mean 'sdpa'" in err
    assert "encoder.feedforward.intermediate_sise" in err
    assert "3 errors" in err
    assert "Traceback" not in err


def test_validate_json_lists_errors(capsys, tmp_path):
    bad = write(tmp_path / "bad.yaml", "hidden_size: 30\nencoder: {attention: {num_heads: 4}, num_layers: 0}\n")
    code, out, _ = run(capsys, "validate", str(bad), "--json")
    assert code == 1
    data = json.loads(out)
    assert data["valid"] is False
    assert {e["loc"] for e in data["errors"]} == {"encoder.num_layers"}  # schema errors stop before cross checks


def test_validate_set_override_is_validated(capsys, tiny_yaml):
    code, _, err = run(capsys, "validate", str(tiny_yaml), "--set", "encoder.attention.num_heads=5")
    assert code == 1
    assert "encoder.attention.num_heads: must divide hidden_size 32" in err


# ------------------------------------------------------------------------------------------- bad input
def test_missing_file(capsys, tmp_path):
    code, out, err = run(capsys, "validate", str(tmp_path / "nope.yaml"))
    assert code == 1
    assert out == ""
    assert "nope.yaml" in err
    assert "not found" in err or "no such file" in err
    assert len(err.strip().splitlines()) == 1


def test_malformed_yaml_names_the_line(capsys, tmp_path):
    bad = write(tmp_path / "broken.yaml", "vocab_size: 99\nencoder:\n  num_layers: [2\n  attention: {}\n")
    code, _, err = run(capsys, "build", str(bad))
    assert code == 1
    assert "malformed YAML" in err
    assert "line 4" in err  # where the parser gives up on the unclosed list
    assert "Traceback" not in err


def test_unknown_preset_names_the_closest(capsys):
    code, _, err = run(capsys, "build", "bert-bse-uncased")
    assert code == 1
    assert "unknown preset 'bert-bse-uncased'" in err
    closest_part = err.split("closest:", 1)[1].split(";", 1)[0]
    assert "bert-base-uncased" in closest_part


def test_invalid_override_syntax(capsys, tiny_yaml):
    code, _, err = run(capsys, "validate", str(tiny_yaml), "--set", "encoder.num_layers")
    assert code == 1
    assert "dotted.key=value" in err


def test_usage_errors_exit_2(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert cli.main(["components", "gadget"]) == 2  # not a kind
    assert cli.main(["validate"]) == 2  # missing CONFIG
    err = capsys.readouterr().err
    assert "invalid choice" in err


def test_help_and_version_exit_0(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.SUBCOMMANDS:
        assert name in out
    assert cli.main(["--version"]) == 0
    assert bertblocks.__version__ in capsys.readouterr().out


def test_unexpected_errors_exit_4_and_debug_shows_the_traceback(capsys, monkeypatch):
    def explode(args):
        raise RuntimeError("kaboom")

    monkeypatch.setitem(cli.SUBCOMMANDS, "explode", cli.Subcommand("explode", "test", lambda p: None, explode))
    code, _, err = run(capsys, "explode")
    assert code == 4
    assert "bertblocks explode: error: RuntimeError: kaboom" in err
    assert "Traceback" not in err
    code, _, err = run(capsys, "explode", "--debug")
    assert code == 4
    assert "Traceback" in err


def test_register_subcommand_refuses_a_taken_name(monkeypatch):
    monkeypatch.setattr(cli, "SUBCOMMANDS", dict(cli.SUBCOMMANDS))
    with pytest.raises(ValueError, match="already registered"):
        cli.register_subcommand("build", "again", lambda p: None, lambda a: 0)
    cli.register_subcommand("hello", "say hello", lambda p: p.add_argument("who"), lambda a: print(a.who) or 0)
    assert cli.main(["hello", "world"]) == 0


def test_lazy_subcommand_that_cannot_be_imported_exits_3_and_leaves_the_others_working(capsys, monkeypatch):
    monkeypatch.setitem(
        cli.SUBCOMMANDS, "ablate", cli.Subcommand("ablate", "x", "bertblocks.no_such_module:configure", "x:y")
    )
    assert cli.main(["presets", "bert-tiny-uncased"]) == 0
    assert cli.main(["ablate", "grid.yaml"]) == 3
    assert "bertblocks.no_such_module:configure is not available" in capsys.readouterr().err


# --------------------------------------------------------------------------------- plugins, components
def test_plugins_lists_builtins_with_distribution_and_version(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    version = bertblocks.registry.get_registry().plugins()[0].version
    line = next(line for line in out.splitlines() if line.startswith("bertblocks.plugins.attention"))
    assert line.split()[1:4] == ["bertblocks", version, "register_components"]


def test_plugins_shows_in_process_and_broken_plugins(capsys):
    def broken_hook():
        raise RuntimeError("cannot register")

    registry = Registry(load_entry_points=False)
    registry.register(SimpleNamespace(bertblocks_register_components=lambda: []), "friendly", version="1.2")
    registry.register(SimpleNamespace(bertblocks_register_components=broken_hook), "grumpy", distribution="grumpy-dist")
    set_registry(registry)
    code, out, _ = run(capsys, "plugins", "--json")
    assert code == 1  # a plugin failed to load
    data = json.loads(out)
    assert {
        "name": "friendly",
        "distribution": "(in-process)",
        "version": "1.2",
        "hooks": ["bertblocks_register_components"],
    } in data["plugins"]
    assert data["errors"][0]["plugin"] == "grumpy"
    assert "cannot register" in data["errors"][0]["detail"]
    code, out, _ = run(capsys, "plugins")
    assert "FAILED  grumpy (grumpy-dist): RuntimeError: cannot register" in out


def test_components_of_one_kind(capsys):
    code, out, _ = run(capsys, "components", "backend")
    assert code == 0
    version = bertblocks.registry.get_registry().plugins()[0].version
    assert out.splitlines()[2].split()[:4] == ["backend", "eager", "bertblocks", version]
    names = [line.split()[1] for line in out.splitlines()[2:]]
    assert names == [c.name for c in bertblocks.registry.get_registry().components("backend")]
    assert "eager" in names
    assert "sdpa" in names
    assert all(line.startswith("backend") for line in out.splitlines()[2:])


def test_components_json_shows_plugin_options(capsys):
    from pydantic import BaseModel, ConfigDict, Field

    class WindowOptions(BaseModel):
        model_config = ConfigDict(extra="forbid")
        window: int = Field(128, description="keys at most this far away")

    registry = Registry(load_entry_points=False)
    plugin = SimpleNamespace(
        bertblocks_register_components=lambda: [
            Component("backend", "windowed", lambda options: None, WindowOptions, "a test backend")
        ]
    )
    registry.register(plugin, "windowed-plugin")
    set_registry(registry)
    code, out, _ = run(capsys, "--json", "components", "backend")
    assert code == 0
    entry = next(c for c in json.loads(out) if c["name"] == "windowed")
    assert entry["provider"] == "windowed-plugin"
    assert (entry["plugin"], entry["distribution"]) == ("windowed-plugin", "(in-process)")
    assert entry["options"] == [
        {
            "name": "window",
            "type": "int",
            "default": 128,
            "required": False,
            "description": "keys at most this far away",
        }
    ]
    code, out, _ = run(capsys, "components", "backend", "--verbose")
    assert "backend windowed: window (int, default 128)" in out


# ---------------------------------------------------------------------------------------------- presets
def test_presets_with_pattern(capsys):
    code, out, _ = run(capsys, "presets", "bert-*-cased")
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines()[2:]]
    everything = [p.name for p in bertblocks.registry.get_registry().presets()]
    assert listed == [n for n in everything if fnmatchcase(n, "bert-*-cased")]
    assert "bert-base-cased" in listed
    assert "bert-base-uncased" not in listed


def test_presets_json_and_no_match(capsys):
    code, out, _ = run(capsys, "presets", "--json")
    assert code == 0
    assert {p["name"] for p in json.loads(out)} == {p.name for p in bertblocks.registry.get_registry().presets()}
    code, _, err = run(capsys, "presets", "gpt-*")
    assert code == 1
    assert "no preset matches 'gpt-*'" in err


# ---------------------------------------------------------------------------------------------- diagram
def test_diagram_groups_identical_layers_and_marks_overrides(capsys, tmp_path):
    cfg = {**TINY, "encoder": {**TINY["encoder"], "num_layers": 5}}
    cfg["encoder"]["overrides"] = [{"layers": "3-4", "attention": {"backend": "eager"}}]
    path = write(tmp_path / "ablation.yaml", yaml.safe_dump(cfg))
    code, out, _ = run(capsys, "diagram", str(path))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "flowchart TD"
    nodes = [line.strip() for line in lines if line.strip().startswith("layers_")]
    assert nodes[0].startswith('layers_0_2["layers 0–2 (×3)<br/>attention: bert · sdpa · 4 heads')
    assert nodes[1].startswith('layers_3_4["layers 3–4 (×2) · override<br/>attention: bert · eager · 4 heads')
    assert "    class layers_3_4 override" in lines
    assert '    embeddings -->|"[b, q, 32]"| layers_0_2' in lines
    assert '    layers_0_2 -->|"[b, q, 32]"| layers_3_4' in lines
    assert any(line.strip().startswith("pooler[") for line in lines)


def test_diagram_markdown_fence(capsys, tiny_yaml):
    code, out, _ = run(capsys, "diagram", str(tiny_yaml), "--markdown")
    assert code == 0
    assert out.startswith("```mermaid\nflowchart TD\n")
    assert out.rstrip().endswith("```")


# ------------------------------------------------------------------------------------- convert, schema
def test_convert_yaml_to_hf_json_that_transformers_reads(capsys, tiny_yaml, tmp_path):
    import transformers

    out_path = tmp_path / "config.json"
    code, out, _ = run(capsys, "convert", str(tiny_yaml), str(out_path))
    assert code == 0
    assert "HF config.json" in out
    hf = transformers.BertConfig.from_json_file(out_path)
    assert (hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.intermediate_size) == (
        99,
        32,
        2,
        4,
        37,
    )
    # and back: the YAML read from the HF file is the same config
    back = tmp_path / "back.yaml"
    assert run(capsys, "convert", str(out_path), str(back))[0] == 0
    assert bertblocks.load_config(back) == bertblocks.load_config(tiny_yaml)


def test_convert_applies_set_and_refuses_to_overwrite(capsys, tiny_yaml, tmp_path):
    out_path = tmp_path / "c.yaml"
    assert run(capsys, "convert", str(tiny_yaml), str(out_path), "--set", "position=relative_key")[0] == 0
    assert bertblocks.load_config(out_path).position.name == "relative_key"
    code, _, err = run(capsys, "convert", str(tiny_yaml), str(out_path))
    assert code == 1
    assert "--force" in err
    assert run(capsys, "convert", str(tiny_yaml), str(out_path), "--force")[0] == 0
    code, _, err = run(capsys, "convert", str(tiny_yaml), str(tmp_path / "c.txt"))
    assert code == 1
    assert "extension" in err


def test_schema(capsys, tmp_path):
    code, out, _ = run(capsys, "schema")
    assert code == 0
    assert json.loads(out) == BertConfig.model_json_schema()
    target = tmp_path / "schema.json"
    assert run(capsys, "schema", "-o", str(target))[0] == 0
    assert json.loads(target.read_text()) == BertConfig.model_json_schema()


# ------------------------------------------------------------------------------------ installed script
def test_installed_console_script():
    script = Path(sys.executable).parent / "bertblocks"
    assert script.is_file(), f"the console script is not installed next to {sys.executable}; pip install -e ."
    done = subprocess.run(
        [str(script), "presets", "bert-tiny-*", "--json"], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "bert-tiny-uncased" in {p["name"] for p in json.loads(done.stdout)}


# ------------------------------------------------------------------------------------------------ trace
def test_trace_shows_shapes_through_every_layer(capsys, tmp_path):
    from bertblocks.sentence import minilm_path

    cfg = {**TINY, "vocab_size": 30522, "position": "relative_key"}
    path = write(tmp_path / "rel.yaml", yaml.safe_dump(cfg))
    code, out, err = run(capsys, "trace", str(path), "--text", "The cat sat on the mat.", "--pair", "It purred.")
    assert code == 0, err
    tokenizer = bertblocks.BertTokenizer.from_pretrained(minilm_path())
    ids = tokenizer("The cat sat on the mat.", "It purred.")["input_ids"][0]
    n = len(ids)
    tokens = [tokenizer.backend.id_to_token(i) for i in ids.tolist()]
    assert out.splitlines()[0] == f"tokens ({n}): {' '.join(tokens)}"
    assert f"embeddings: BertEmbeddings  input_ids [1, {n}], token_type_ids [1, {n}] → out [1, {n}, 32]" in out
    for i in range(2):
        assert f"encoder.layer.{i}.attention: BertAttention[sdpa]  hidden_states [1, {n}, 32]" in out
        assert f"encoder.layer.{i}.intermediate: BertIntermediate  hidden_states [1, {n}, 32] → out [1, {n}, 37]" in out
        assert f"encoder.layer.{i}.output: BertOutput  intermediate [1, {n}, 37], residual [1, {n}, 32]" in out
    assert f"Q, K, V [1, 4, {n}, 8] → scores [1, 4, {n}, {n}] + RelativeBias [1, 4, {n}, {n}]" in out
    assert "pooler: FirstTokenPooler" in out
    assert f"→ last_hidden_state [1, {n}, 32], pooler_output [1, 32]" in out


def test_trace_takes_ids_modulo_a_small_vocabulary(capsys, tiny_yaml):
    from bertblocks.sentence import minilm_path

    code, out, err = run(capsys, "trace", str(tiny_yaml), "--text", "Zebras graze.", "--json")
    assert code == 0, err
    data = json.loads(out)
    ids = bertblocks.BertTokenizer.from_pretrained(minilm_path())("Zebras graze.")["input_ids"][0]
    assert data["input_ids"] == (ids % 99).tolist()
    assert data["notes"] == ["token ids taken modulo vocab_size=99"]
    paths = [s["path"] for s in data["steps"]]
    assert paths.index("embeddings") < paths.index("encoder.layer.0.attention") < paths.index("pooler")


def test_trace_a_checkpoint_uses_its_weights_and_tokenizer(capsys):
    from bertblocks.sentence import minilm_path

    code, out, err = run(capsys, "trace", str(minilm_path()), "--text", "hello world", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["tokens"] == ["[CLS]", "hello", "world", "[SEP]"]
    layers = {s["path"] for s in data["steps"] if s["path"].endswith(".attention")}
    assert layers == {f"encoder.layer.{i}.attention" for i in range(6)}
    model_step = next(s for s in data["steps"] if s["path"] == "")
    assert model_step["outputs"]["last_hidden_state"] == [1, 4, 384]


def test_trace_tokenizer_directory_without_vocabulary(capsys, tiny_yaml, tmp_path):
    empty = tmp_path / "no-vocab"
    empty.mkdir()
    code, _, err = run(capsys, "trace", str(tiny_yaml), "--text", "hi", "--tokenizer", str(empty))
    assert code == 1
    assert "no tokenizer in" in err
    assert "Traceback" not in err


def test_trace_requires_text(capsys, tiny_yaml):
    assert cli.main(["trace", str(tiny_yaml)]) == 2
    assert "--text" in capsys.readouterr().err


# -------------------------------------------------------------------------------------- embed, similarity
SENTENCES = ("A man is eating food.", "A man is eating pasta.", "The sky is blue today.")


def test_embed_matches_the_library_and_is_normalised(capsys):
    from bertblocks.sentence import encode, minilm_path

    code, out, err = run(capsys, "embed", *SENTENCES, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["shape"] == [3, 384]
    vectors = torch.tensor([e["vector"] for e in data["embeddings"]])
    directory = minilm_path()
    expected = encode(
        bertblocks.from_pretrained(directory).eval(), bertblocks.BertTokenizer.from_pretrained(directory), SENTENCES
    )
    assert_close(vectors, expected)
    assert_close(vectors.norm(dim=-1), torch.ones(3))
    code, out, _ = run(capsys, "embed", "--model", str(directory), SENTENCES[0])
    assert code == 0
    first = ", ".join(f"{v:+.4f}" for v in expected[0, :6].tolist())
    assert out.splitlines() == [
        "1 embedding of dimension 384 (mean-pooled, L2-normalised)",
        f"{SENTENCES[0]}: [{first}, …]",
    ]


def test_similarity_table_ranks_related_sentences_together(capsys):
    code, out, err = run(capsys, "similarity", *SENTENCES, "--json")
    assert code == 0, err
    scores = torch.tensor(json.loads(out)["similarity"])
    assert_close(scores.diagonal(), torch.ones(3))
    assert_close(scores, scores.T)  # a GEMM need not round symmetrically
    assert scores[0, 1] > 0.5 > scores[0, 2]  # food/pasta belong together, the sky does not
    code, out, _ = run(capsys, "similarity", *SENTENCES)
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("[0]  "))
    assert row.split()[1:] == [f"{v:.3f}" for v in scores[0].tolist()]


def test_embed_with_a_missing_model(capsys, tmp_path):
    code, _, err = run(capsys, "embed", "--model", str(tmp_path / "nowhere"), "hi")
    assert code == 1
    assert "nowhere" in err
    assert "Traceback" not in err


# -------------------------------------------------------------------------------------------- task heads
def test_build_bert_base_cased_with_mlm_head_counts_like_torchinfo(capsys):
    """The figures the issue quotes from torchinfo, and the unique count transformers gives the same model."""
    import transformers

    code, out, err = run(capsys, "build", "bert-base-cased", "--head", "masked_lm")
    assert code == 0, err
    assert "Total params (counted per module): 130,609,732" in out
    assert "Unique params: 108,340,804 (22,268,928 shared)" in out
    assert out.splitlines()[4].split() == ["BertForMaskedLM", "130,609,732"]
    with torch.device("meta"):
        reference = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=28996))
    assert reference.num_parameters() == 108_340_804
    tied = reference.get_input_embeddings().weight.numel()
    assert 108_340_804 + tied == 130_609_732  # the decoder shares the word embeddings: counted in both branches


def test_trace_a_task_checkpoint_runs_its_head(capsys, hf_checkpoint):
    from bertblocks.sentence import minilm_path

    directory = hf_checkpoint("BertForMaskedLM")
    code, out, err = run(
        capsys, "trace", str(directory), "--text", "a test", "--tokenizer", str(minilm_path()), "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    model_step = data["steps"][0]
    assert model_step["type"] == "BertForMaskedLM"
    assert model_step["outputs"]["logits"] == [1, 4, 99]
    assert data["notes"] == ["token ids taken modulo vocab_size=99"]
    assert any(s["path"] == "cls.predictions.decoder" for s in data["steps"])


def test_diagram_and_build_with_a_classification_head(capsys, tiny_yaml):
    code, out, err = run(capsys, "diagram", str(tiny_yaml), "--head", "sequence_classification")
    assert code == 0, err
    assert '    head["head: sequence_classification"]' in out
    assert "    pooler -.-> head" in out
    code, out, _ = run(capsys, "build", str(tiny_yaml), "--head", "sequence_classification", "--set", "num_labels=3")
    assert code == 0
    assert any(
        line.split()[:2] == ["classifier:", "Linear"] and line.endswith(f"{32 * 3 + 3:,}") for line in out.splitlines()
    )


def test_build_with_an_unknown_head(capsys, tiny_yaml):
    code, _, err = run(capsys, "build", str(tiny_yaml), "--head", "masked_lmm")
    assert code == 1
    assert "unknown head 'masked_lmm'" in err
    assert "did you mean 'masked_lm'" in err


def test_diagram_of_a_decoder_says_causal_and_cross_attention(capsys, tiny_yaml):
    code, out, err = run(
        capsys, "diagram", str(tiny_yaml), "--set", "is_decoder=true", "--set", "add_cross_attention=true"
    )
    assert code == 0, err
    assert "attention: bert · sdpa · 4 heads · causal + cross-attention" in out


def test_progress_lines_go_to_a_terminal_only(monkeypatch, capsys):
    """Slow commands say what they do when a person watches; scripts and --json readers get nothing extra."""
    import argparse
    import sys

    from bertblocks.cli import progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    progress(argparse.Namespace(json=False), "loading x")
    progress(argparse.Namespace(json=True), "loading y")
    assert capsys.readouterr().err == "loading x…\n"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    progress(argparse.Namespace(json=False), "loading z")
    assert capsys.readouterr().err == ""


def test_every_commands_set_option_is_the_one_declaration():
    """``--set`` is declared once (cli.add_set_argument): every command that takes it, ``ablate`` included, has
    the same option (destination, repetition, metavar, help wording), and parses repeats in order."""
    import argparse
    import re

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = {}
    for name, sub in commands.items():
        for action in sub._actions:
            if "--set" in action.option_strings:
                assert (action.dest, type(action).__name__, action.metavar, action.default) == (
                    "overrides",
                    "_AppendAction",
                    "KEY=VALUE",
                    [],
                ), name
                found[name] = re.fullmatch(
                    r"override a (\w+) field \(dotted path, value parsed as YAML\); repeatable, e\.g\. --set \S+.*",
                    action.help,
                )
    assert {"ablate", "validate", "export", "quantize", "embed"} <= set(found)
    assert all(found.values()), [name for name, match in found.items() if not match]
    assert found["ablate"][1] == "study"
    assert found["validate"][1] == "config"
    args = parser.parse_args(["ablate", "study.yaml", "--set", "train.steps=2", "--set", "measure.batch=4"])
    assert args.overrides == ["train.steps=2", "measure.batch=4"]
