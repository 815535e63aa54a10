"""Finding a checkpoint: a local directory, or a Hugging Face hub id resolved through ``huggingface_hub``.

Only the files a BERT needs are fetched, one by one with ``hf_hub_download`` (never a whole snapshot):
``config.json``, then the first weights format the repository has, in order of preference:
``model.safetensors``, ``model.safetensors.index.json`` (plus the shards it names), ``pytorch_model.bin``,
``pytorch_model.bin.index.json`` (plus shards). ``.bin`` files are later read with ``weights_only=True``.

Offline mode: ``local_files_only=True``, or ``HF_HUB_OFFLINE=1`` in the environment (read at every call, not
only when ``huggingface_hub`` was imported), makes the resolver use the local cache only. A repository that
is not cached then raises :class:`PretrainedNotFoundError`, a ``FileNotFoundError`` whose one-paragraph
message says what was looked for and where.

Example:
    >>> from bertblocks.hf.hub import resolve_pretrained
    >>> directory = resolve_pretrained("sentence-transformers/all-MiniLM-L6-v2", local_files_only=True)
    >>> sorted(p.name for p in directory.iterdir())
    ['config.json', 'model.safetensors', ...]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import BertBlocksError
from ..readers import ReadError, read_json
from .weights import BIN_INDEX, BIN_WEIGHTS, SAFE_INDEX, SAFE_WEIGHTS

CONFIG_FILE = "config.json"
#: weight files in order of preference: (single file, sharded index)
WEIGHT_FILES = ((SAFE_WEIGHTS, SAFE_INDEX), (BIN_WEIGHTS, BIN_INDEX))
#: what a tokenizer may need; each is optional, but one of tokenizer.json / vocab.txt must exist
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


class PretrainedNotFoundError(BertBlocksError, FileNotFoundError):
    """Neither a local directory nor a hub repository (or file) that could be found; the message says why."""


def is_offline(local_files_only: bool = False) -> bool:
    """Whether to stay off the network: ``local_files_only`` or ``HF_HUB_OFFLINE`` set to a true value."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return local_files_only or env or constants.is_offline_mode()


def resolve_pretrained(
    path_or_id: str | Path,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
) -> Path:
    """The local directory holding a checkpoint's ``config.json`` and weights.

    Args:
        path_or_id: a local directory (returned as is), or a hub repository id such as ``"org/name"``.
        revision: branch, tag or commit of the hub repository (default ``main``).
        cache_dir: the hub cache to use (default: ``huggingface_hub``'s, ``HF_HUB_CACHE``).
        local_files_only: never touch the network; ``HF_HUB_OFFLINE=1`` does the same.
        token: hub token for private repositories (default: the one ``huggingface_hub`` finds).

    Returns:
        The directory (for a hub id: the snapshot folder in the cache) with ``config.json`` and the
        weights in the preferred format that the repository has.

    Raises:
        PretrainedNotFoundError: not a directory, and not a repository (or a revision, or weights) that the
            hub or the cache has.
    """
    local = _local_directory(path_or_id)
    if local is not None:
        return local
    repo_id = str(path_or_id)
    fetch = _Fetcher(repo_id, revision, cache_dir, local_files_only, token)
    config = fetch.required(CONFIG_FILE)
    for single, index in WEIGHT_FILES:
        if fetch.optional(single) is not None:
            return config.parent
        index_path = fetch.optional(index)
        if index_path is not None:
            for shard in _shards(index_path):
                fetch.required(shard)
            return config.parent
    names = ", ".join(n for pair in WEIGHT_FILES for n in pair)
    raise PretrainedNotFoundError(f"{fetch.describe()} has {CONFIG_FILE} but no weights (looked for {names}).")


def resolve_tokenizer_files(
    path_or_id: str | Path,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
    files: Sequence[str] = TOKENIZER_FILES,
) -> Path:
    """The local directory holding a tokenizer's files (``tokenizer.json`` and/or ``vocab.txt``, configs).

    Arguments as for :func:`resolve_pretrained`; ``files`` are fetched when the repository has them. Whether
    they suffice is for the tokenizer to judge (a local directory is returned as is).

    Raises:
        PretrainedNotFoundError: not a directory, and not a repository that the hub or the cache has.
    """
    local = _local_directory(path_or_id)
    if local is not None:
        return local
    fetch = _Fetcher(str(path_or_id), revision, cache_dir, local_files_only, token)
    found = [p for p in (fetch.optional(name) for name in files) if p is not None]
    if not found:
        raise fetch._error(f"any of the tokenizer files ({', '.join(files)})", None)
    return found[0].parent


def _local_directory(path_or_id: str | Path) -> Path | None:
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise PretrainedNotFoundError(f"{path} is a file; expected a checkpoint directory or a hub id.")
    if isinstance(path_or_id, Path) or looks_like_a_path(str(path_or_id)):
        raise PretrainedNotFoundError(
            f"{path_or_id} is not a directory (it does not exist), and it looks like a path, so it was not tried "
            "as a hub id (hub ids look like 'name' or 'org/name')."
        )
    if not _could_be_repo_id(str(path_or_id)):
        raise PretrainedNotFoundError(
            f"{path_or_id} is not a directory (and not a hub id of the form 'name' or 'org/name')."
        )
    return None


#: endings of files, never of hub ids: a name ending so is a path that does not exist
PATH_SUFFIXES = (".json", ".yaml", ".yml", ".safetensors", ".bin", ".txt")


def looks_like_a_path(text: str) -> bool:
    """Whether ``text`` is meant as a local path, so that it is never tried as a hub id (offline, the hub
    would be retried for half a minute before failing).

    A path: contains a separator a hub id cannot have (``\\``, or more than the one ``/`` of ``org/name``),
    starts with ``.``, ``~`` or ``/``, ends with a file suffix (``.json``, ``.yaml``, ``.safetensors``, …), or
    its first part is a local folder (``models/bert`` beside a ``models`` folder).
    """
    if "\\" in text or text.count("/") > 1 or text.startswith((".", "~", "/")):
        return True
    if text.lower().endswith(PATH_SUFFIXES):
        return True
    return "/" in text and Path(text.split("/", 1)[0]).is_dir()


def _could_be_repo_id(text: str) -> bool:
    from huggingface_hub.utils import validate_repo_id

    if text.count("/") > 1 or text.startswith((".", "/", "~")):
        return False
    try:
        validate_repo_id(text)
    except Exception:  # HFValidationError; any failure means "not a repo id"
        return False
    return True


def _shards(index_path: Path) -> list[str]:
    try:
        weight_map = read_json(index_path)["weight_map"]
        shards = list(dict.fromkeys(weight_map.values()))
    except (OSError, ReadError, KeyError, TypeError, AttributeError) as e:
        raise PretrainedNotFoundError(f"{index_path} is not a readable shard index ({e}).") from None
    # a shard is a file of the repository's top folder; never fetch (or write) a path out of it
    outside = [s for s in shards if not isinstance(s, str) or Path(s).name != s or s in ("", ".", "..")]
    if outside:
        raise PretrainedNotFoundError(f"{index_path} names shards that are not file names: {outside}.")
    return shards


class _Fetcher:
    """``hf_hub_download`` of single files of one repository, errors turned into one clear message."""

    def __init__(
        self,
        repo_id: str,
        revision: str | None,
        cache_dir: str | Path | None,
        local_files_only: bool,
        token: str | bool | None,
    ) -> None:
        self.repo_id, self.revision, self.cache_dir, self.token = repo_id, revision, cache_dir, token
        self.offline = is_offline(local_files_only)

    def describe(self) -> str:
        at = f" at revision {self.revision!r}" if self.revision else ""
        return f"hub repository {self.repo_id!r}{at}"

    def _download(self, filename: str) -> Path:
        from huggingface_hub import hf_hub_download

        return Path(
            hf_hub_download(
                self.repo_id,
                filename,
                revision=self.revision,
                cache_dir=self.cache_dir,
                local_files_only=self.offline,
                token=self.token,
                library_name="bertblocks",
            )
        )

    def optional(self, filename: str) -> Path | None:
        """The file, or ``None`` when the repository (or, offline, the cache) lacks it."""
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

        try:
            return self._download(filename)
        except LocalEntryNotFoundError as e:
            if self.offline:  # not in the cache, and we may not ask
                return None
            # online, yet only the cache answered: the hub could not be reached
            raise self._error(filename, e) from None
        except EntryNotFoundError:  # the hub says the repository has no such file
            return None
        except Exception as e:
            raise self._error(filename, e) from None

    def required(self, filename: str) -> Path:
        """The file; its absence is a :class:`PretrainedNotFoundError`."""
        found = self.optional(filename)
        if found is None:
            raise self._error(filename, None)
        return found

    def _error(self, filename: str, cause: Exception | None) -> PretrainedNotFoundError:
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = f"the hub cache ({self.cache_dir})" if self.cache_dir else "the hub cache"
        if self.offline:
            return PretrainedNotFoundError(
                f"{self.repo_id!r} is not a local directory, and {filename} of {self.describe()} is not "
                f"in {where}. Offline mode is on (local_files_only=True or HF_HUB_OFFLINE=1), so the hub was not "
                "asked: download the model once while online, or pass the path of a directory that holds "
                "config.json and the weights."
            )
        if isinstance(cause, GatedRepoError):
            why = "is gated: accept its terms on the hub and pass a token (token=... or `hf auth login`)"
        elif isinstance(cause, RepositoryNotFoundError):
            why = "does not exist on the hub (or is private: pass a token)"
        elif isinstance(cause, RevisionNotFoundError):
            why = "has no such revision"
        elif cause is None:
            why = f"has not {filename}" if filename.startswith("any ") else f"has no {filename}"
        elif isinstance(cause, LocalEntryNotFoundError):
            why = f"could not be reached, and {filename} is not in {where}"
        else:
            why = f"could not be fetched ({type(cause).__name__}: {_first_line(cause)})"
        return PretrainedNotFoundError(
            f"{self.repo_id!r} is not a local directory, and {self.describe()} {why}. Pass the path of a "
            "directory that holds config.json and the weights, or a hub id of a BERT checkpoint."
        )


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


__all__ = [
    "PretrainedNotFoundError",
    "is_offline",
    "looks_like_a_path",
    "resolve_pretrained",
    "resolve_tokenizer_files",
]
