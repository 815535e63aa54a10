"""Hub ids resolved through huggingface_hub against a hub cache laid out on disk by the test: no network.

The layout is huggingface_hub's: ``models--org--name/{refs/<revision>, blobs/<sha>, snapshots/<commit>/<file>}``
with snapshot files as symbolic links into ``blobs``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import traceback
from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers

import bertblocks
from bertblocks.hf.hub import PretrainedNotFoundError, is_offline, resolve_pretrained
from tests.conftest import batch
from tests.tolerances import assert_close

REPO = "acme/tiny-bert"


def lay_out_cache(cache: Path, repo_id: str, files: dict[str, Path], revision: str = "main") -> Path:
    """Put ``files`` (name in repo → local file) into a hub cache as commit ``revision``; return the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


def files_of(directory: Path) -> dict[str, Path]:
    return {p.name: p for p in directory.iterdir() if p.is_file()}


@pytest.fixture
def spy(monkeypatch):
    """Record every hf_hub_download call (filename, local_files_only) and pass it through."""
    calls: list[tuple[str, bool]] = []
    original = huggingface_hub.hf_hub_download

    def recording(repo_id, filename, **kwargs):
        calls.append((filename, kwargs.get("local_files_only", False)))
        return original(repo_id, filename, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", recording)
    return calls


def test_a_local_directory_is_returned_as_is(hf_checkpoint, spy):
    directory = hf_checkpoint()
    assert resolve_pretrained(directory) == directory
    assert resolve_pretrained(str(directory)) == directory
    assert spy == []  # the hub is not involved


def test_a_cached_hub_id_loads_offline_and_matches_transformers(hf_checkpoint, tmp_path, spy):
    source = hf_checkpoint()
    snapshot = lay_out_cache(tmp_path / "cache", REPO, files_of(source))
    assert resolve_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True) == snapshot
    ours = bertblocks.BertModel.from_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True).eval()
    theirs = transformers.BertModel.from_pretrained(source).eval()
    inputs = batch()
    real = inputs["attention_mask"].bool()  # padded positions are not compared: bertblocks may skip them
    with torch.no_grad():
        mine, hf = ours(**inputs), theirs(**inputs)
    assert_close(mine.last_hidden_state[real], hf.last_hidden_state[real])
    assert_close(mine.pooler_output, hf.pooler_output)
    assert {name for name, _ in spy} == {"config.json", "model.safetensors"}
    assert all(offline for _, offline in spy)


def test_hf_hub_offline_set_after_import_is_honoured(hf_checkpoint, tmp_path, spy, monkeypatch):
    """huggingface_hub reads HF_HUB_OFFLINE once, at import; bertblocks reads it at every call."""
    lay_out_cache(tmp_path / "cache", REPO, files_of(hf_checkpoint()))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert is_offline()
    resolve_pretrained(REPO, cache_dir=tmp_path / "cache")
    assert spy
    assert all(offline for _, offline in spy)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert is_offline() == huggingface_hub.constants.is_offline_mode()


def test_only_the_preferred_weights_are_fetched(hf_checkpoint, tmp_path, spy):
    source = files_of(hf_checkpoint())
    bin_file = tmp_path / "pytorch_model.bin"
    torch.save({"unused": torch.zeros(1)}, bin_file)
    lay_out_cache(tmp_path / "cache", REPO, {**source, "pytorch_model.bin": bin_file})
    resolve_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True)
    assert [name for name, _ in spy] == ["config.json", "model.safetensors"]


def test_sharded_safetensors_fetch_the_index_and_every_shard(tmp_path, spy):
    torch.manual_seed(0)
    model = bertblocks.create_model("bert-tiny-uncased", vocab_size=99, max_position_embeddings=64).eval()
    model.save_pretrained(tmp_path / "saved", max_shard_size=200_000)
    saved = files_of(tmp_path / "saved")
    shards = sorted(n for n in saved if n.startswith("model-"))
    assert len(shards) > 1
    lay_out_cache(tmp_path / "cache", REPO, saved)
    loaded = bertblocks.BertModel.from_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    fetched = [name for name, _ in spy]
    assert fetched[:3] == ["config.json", "model.safetensors", "model.safetensors.index.json"]
    assert sorted(fetched[3:]) == shards


def test_a_bin_only_repository_falls_back_to_pytorch_model_bin(hf_checkpoint, tmp_path):
    source = hf_checkpoint()
    theirs = transformers.BertModel.from_pretrained(source).eval()
    bin_file = tmp_path / "pytorch_model.bin"
    torch.save(theirs.state_dict(), bin_file)
    lay_out_cache(tmp_path / "cache", REPO, {"config.json": source / "config.json", "pytorch_model.bin": bin_file})
    directory = resolve_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True)
    assert {p.name for p in directory.iterdir()} == {"config.json", "pytorch_model.bin"}
    ours = bertblocks.BertModel.from_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True).eval()
    inputs = {"input_ids": batch()["input_ids"]}
    with torch.no_grad():
        assert_close(ours(**inputs).last_hidden_state, theirs(**inputs).last_hidden_state)


def test_revision_picks_that_snapshot(hf_checkpoint, tmp_path):
    main = lay_out_cache(tmp_path / "cache", REPO, files_of(hf_checkpoint(seed=0)))
    v1 = lay_out_cache(tmp_path / "cache", REPO, files_of(hf_checkpoint(seed=1)), revision="v1")
    assert main != v1
    assert resolve_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True) == main
    assert resolve_pretrained(REPO, revision="v1", cache_dir=tmp_path / "cache", local_files_only=True) == v1
    with pytest.raises(PretrainedNotFoundError, match="at revision 'v2'"):
        resolve_pretrained(REPO, revision="v2", cache_dir=tmp_path / "cache", local_files_only=True)


def test_an_unknown_hub_id_offline_says_so_in_one_paragraph(tmp_path):
    (tmp_path / "cache").mkdir()
    with pytest.raises(PretrainedNotFoundError) as err:
        bertblocks.from_pretrained("acme/no-such-bert", cache_dir=tmp_path / "cache", local_files_only=True)
    assert isinstance(err.value, FileNotFoundError)
    message = str(err.value)
    assert "'acme/no-such-bert' is not a local directory" in message
    assert "Offline mode is on" in message
    assert "\n" not in message
    assert _single_traceback(err.value)


def test_a_cached_repository_without_weights_names_what_was_looked_for(hf_checkpoint, tmp_path):
    lay_out_cache(tmp_path / "cache", REPO, {"config.json": hf_checkpoint() / "config.json"})
    with pytest.raises(PretrainedNotFoundError, match=r"has config.json but no weights \(looked for model.safetensors"):
        resolve_pretrained(REPO, cache_dir=tmp_path / "cache", local_files_only=True)


def test_a_missing_path_or_a_file_is_not_taken_for_a_hub_id(tmp_path, spy):
    with pytest.raises(PretrainedNotFoundError, match="is not a directory"):
        resolve_pretrained(tmp_path / "missing")
    with pytest.raises(PretrainedNotFoundError, match="is not a directory"):
        resolve_pretrained("./checkpoints/missing")
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(PretrainedNotFoundError, match="is a file"):
        resolve_pretrained(tmp_path / "weights.safetensors")
    assert spy == []


def _single_traceback(error: BaseException) -> bool:
    """No chained huggingface_hub traceback is printed above ours."""
    text = "".join(traceback.format_exception(error))
    return "During handling of the above exception" not in text and "direct cause" not in text


def _hub_error(cls: type[Exception], message: str) -> Exception:
    # huggingface_hub's HTTP errors want a live response; the message is all the resolver reads.
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error


@pytest.mark.parametrize(
    ("error", "says"),
    [
        ("RepositoryNotFoundError", "does not exist on the hub (or is private: pass a token)"),
        ("RevisionNotFoundError", "has no such revision"),
        ("GatedRepoError", "is gated"),
        ("LocalEntryNotFoundError", "could not be reached, and config.json is not in the hub cache"),
    ],
)
def test_online_hub_errors_become_one_clear_error(monkeypatch, error, says):
    from huggingface_hub import errors

    def failing(repo_id, filename, **kwargs):
        raise _hub_error(getattr(errors, error), "404 Client Error: long server message\nwith more lines")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(PretrainedNotFoundError) as err:
        resolve_pretrained(REPO)
    assert says in str(err.value)
    assert "\n" not in str(err.value)
    assert _single_traceback(err.value)


def test_the_tokenizer_resolves_hub_ids_from_the_cache_too(tmp_path):
    from bertblocks.sentence import minilm_path

    source = minilm_path()
    tokenizer_files = {n: source / n for n in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")}
    lay_out_cache(tmp_path / "cache", "sentence-transformers/all-MiniLM-L6-v2", tokenizer_files)
    ours = bertblocks.BertTokenizer.from_pretrained(
        "sentence-transformers/all-MiniLM-L6-v2", cache_dir=tmp_path / "cache", local_files_only=True
    )
    local = bertblocks.BertTokenizer.from_pretrained(source)
    assert ours("Hello world, café!", return_tensors=None) == local("Hello world, café!", return_tensors=None)
    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(PretrainedNotFoundError, match="Offline mode is on"):
        bertblocks.BertTokenizer.from_pretrained(
            "sentence-transformers/all-MiniLM-L6-v2", cache_dir=tmp_path / "cache", local_files_only=True
        )
