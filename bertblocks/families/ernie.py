"""ERNIE (``model_type: ernie``): BERT under ``ernie.`` plus, with ``use_task_id``, a task-type table in the
embeddings (``embeddings.task_type_embeddings``); its heads are BERT's."""

from __future__ import annotations

from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import Family
from bertblocks.families.keymap import KeyMap

from .bert import BERT_ARCHITECTURES
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField

TASK_TABLE = "task_type_embeddings"


def _from_hf(hf: Any) -> dict[str, Any]:
    src = dict(hf)
    use_task_id = src.pop("use_task_id", False)
    size = src.pop("task_type_vocab_size", 3)
    data = bert_fields_from_hf(src)
    if use_task_id:
        data["embedding"] = {**data["embedding"], "extra_type_tables": {TASK_TABLE: size}}
    else:
        data["hf"]["task_type_vocab_size"] = size
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    tables = config.embedding.options().get("extra_type_tables") or {}
    out["use_task_id"] = TASK_TABLE in tables
    if TASK_TABLE in tables:
        out["task_type_vocab_size"] = tables[TASK_TABLE]
    return out


#: ErnieConfig's fields: BERT's and the task-type table
FIELDS = {**BERT_FIELDS, "use_task_id": HFField(bool), "task_type_vocab_size": HFField(int, ge=1)}

ERNIE = Family(
    model_type="ernie",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KeyMap(prefix="ernie", head_prefixes=("cls.", "classifier.", "qa_outputs.")),
    architectures={
        ("ErnieForCausalLM" if name == "BertLMHeadModel" else name.replace("Bert", "Ernie")): head
        for name, head in BERT_ARCHITECTURES.items()
    },
    base_architecture="ErnieModel",
    fixed={"position.name": "absolute"},
    description="ERNIE: BERT plus optional task-type embeddings",
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "ernie", lambda **_: ERNIE, description=ERNIE.description)]
