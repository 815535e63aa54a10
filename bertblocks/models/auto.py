"""Loading a checkpoint as whatever it is: :func:`from_pretrained` picks the backbone or a task model.

It sits above both the backbone and the task models, so choosing between them needs no import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..atomic import reading
from ..config_files import load_config
from ..errors import InputTypeError
from ..hf.hub import resolve_pretrained
from .backbone import BertModel
from .task_models import task_model_class


def from_pretrained(
    path: str | Path, overrides: Sequence[str] | Mapping[str, Any] = (), *, head: str | None = None, **kwargs: Any
) -> Any:
    """Load a checkpoint as a backbone (default) or as a task model.

    Args:
        path: checkpoint directory or hub id.
        overrides: dotted config overrides.
        head: ``None``: the backbone, :class:`BertModel` (whatever the checkpoint's ``architectures``);
            ``"auto"``: the head ``config.json``'s ``architectures`` names (``BertForMaskedLM`` → a
            :class:`~bertblocks.BertForMaskedLM`), or the backbone if it names none; a head name
            (``"sequence_classification"``): a task model with that head.
        kwargs: as for :meth:`BertModel.from_pretrained` / :meth:`bertblocks.BertTaskModel.from_pretrained`.

    Raises:
        InputTypeError: ``head`` is not a name (a head's options are overrides: ``["head.dim=16"]``).
    """
    if head is not None and not isinstance(head, str):
        raise InputTypeError(
            f"head must be a head name, 'auto' or None, got {type(head).__name__} {head!r}; give a head's options as "
            "overrides, e.g. from_pretrained(path, ['head.dim=16'], head='colbert')"
        )
    if head is None:
        return BertModel.from_pretrained(path, overrides, **kwargs)
    if head == "auto":
        directory = resolve_pretrained(
            path,
            **{k: kwargs[k] for k in ("revision", "cache_dir", "local_files_only", "token") if k in kwargs},
        )
        with reading(directory):  # the head chosen from the config of the generation that is loaded
            config = load_config(directory, overrides, kwargs.get("registry"))
            if config.head is None:
                return BertModel.from_pretrained(directory, overrides, **kwargs)
            return task_model_class(config.head.name).from_pretrained(
                directory, overrides, head=config.head.name, **kwargs
            )
    return task_model_class(head).from_pretrained(path, overrides, head=head, **kwargs)


__all__ = ["from_pretrained"]
