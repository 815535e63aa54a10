"""Task models: a backbone (``self.bert``) plus a head from the registry, with transformers' task-model API.

``BertForMaskedLM``, ``BertForSequenceClassification`` … are drop-ins for transformers' classes of the same
names: the same forward arguments, output fields and checkpoint keys. Each is :class:`BertTaskModel` with its
head fixed; :class:`BertTaskModel` itself takes any registered head (third-party ones included).

Example:
    >>> model = BertForSequenceClassification.from_pretrained("path/to/bert", ["num_labels=3"])
    >>> out = model(input_ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    >>> out.loss.backward()
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from ..config import BertConfig
from ..config_files import ConfigSource, config_data
from ..core.capabilities import padding_readers
from ..core.encoder import EncoderModel
from ..core.interfaces import Head, InputDefault
from ..core.outputs import ModelOutput
from ..errors import InputError
from ..families.bert import BERT_ARCHITECTURES
from ..hf.config_json import config_to_hf
from ..hf.families import FamilyKeyMap, UnknownFamilyError, get_family
from ..registry import BuildError, Registry, build_head, get_registry, validate_config
from ..torch_internals import run_frame_uncompiled
from .backbone import BertModel
from .pretrained import PretrainedModel
from .surface import PretrainedSurface
from .weight_init import init_weights

#: the backbone's output fields a head output also carries (when its type has them), as transformers passes on
_PASSED_THROUGH = ("past_key_values", "hidden_states", "attentions", "cross_attentions")
_LABEL_ARGUMENTS = ("labels", "next_sentence_label", "start_positions", "end_positions")

T = TypeVar("T", bound="BertTaskModel")


class BertTaskModel(PretrainedSurface, PretrainedModel):
    """A backbone plus a task head, with HF's checkpoint keys: ``bert.*`` and the head's (``cls.*``, ``classifier.*``,
    ``qa_outputs.*``).

    The head's child modules are registered on this model under their own names (HF's); the head object keeps
    the logic (logits, loss) and is not itself a registered submodule, so no key carries a ``head.`` prefix and
    ``parameters()`` lists each parameter once.

    Attributes:
        config: the model's config, shared with ``self.bert`` (as transformers shares it).
        bert: the backbone, built without a pooler unless the head reads the pooled output (as transformers).
        head: the head object (logic only; its modules are this model's children).
    """

    #: the head this class always has (``None``: whatever the config or ``head=`` names); a class named as one of
    #: transformers' BERT task classes has the head the BERT family's table gives it
    head_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.head_name = BERT_ARCHITECTURES.get(cls.__name__, cls.head_name)

    def __init__(self, config: BertConfig, backbone: BertModel, head: Head) -> None:
        super().__init__()
        self.config = config
        self.bert = backbone
        for name, child in head.named_children():
            if name == "bert":
                raise BuildError(f"head {type(head).__name__} has a child named 'bert', which is the backbone's")
            self.add_module(name, child)  # HF's key: `classifier.weight`, not `head.classifier.weight`
        # A plain attribute, not a submodule: its children are registered above, once.
        object.__setattr__(self, "head", head)
        # packing leaves zeros at padded positions: fine for heads that ignore them, not for one that reads them
        # (the backbone's own components declared theirs when it was built)
        backbone.padding_readers = (*backbone.padding_readers, *padding_readers(head, name="head"))
        # forward's signature names the family's and the head's inputs (transformers' Trainer keeps those columns)
        self._list_extra_inputs(backbone, head.extra_inputs)
        self._input_defaults = _input_defaults(config, backbone, head)

    #: input name → how the model makes it when a call leaves it out (the family's defaults for this head, then the
    #: head's own; only inputs the backbone or head takes): see :data:`~bertblocks.core.interfaces.InputDefault`
    _input_defaults: dict[str, InputDefault]

    head: Head

    # ------------------------------------------------------------------------------------------- building
    @classmethod
    def _from_config(
        cls: type[T],
        config: ConfigSource,
        overrides: Sequence[str] | Mapping[str, Any] = (),
        *,
        head: str | None = None,
        registry: Registry | None = None,
    ) -> T:
        """Build a randomly initialised task model (HF's initialisation) from a config, a file or a dict.

        Args:
            config: a config, a YAML/JSON file, a checkpoint directory or a dict.
            overrides: dotted config overrides (``["num_labels=3"]``).
            head: the head to use; default: the class's (``BertForMaskedLM`` → ``masked_lm``), else the
                config's ``head``.
            registry: where components are looked up.

        Raises:
            BuildError: no head named, a head that conflicts with the class, or a head the config cannot serve
                (e.g. one reading the pooled output while ``pooler`` is null).
            ConfigError: the config is invalid.
        """
        reg = registry or get_registry()
        if cls.head_name is not None and head is not None and head != cls.head_name:
            raise BuildError(f"{cls.__name__} always has the {cls.head_name!r} head; got head={head!r}")
        data, where = config_data(config, registry=reg)
        wanted = cls.head_name or head
        given = data.get("head")
        if wanted is not None and (given if isinstance(given, str) else (given or {}).get("name")) != wanted:
            # the head is set before the overrides, so that `head.dim=16` reaches the head asked for
            data["head"] = {"name": wanted}
        cfg = validate_config(config_data(data, overrides, registry=reg)[0], reg, source=where)
        name = cls.head_name or head or (cfg.head.name if cfg.head is not None else None)
        if name is None:
            raise BuildError(
                "no head: the config names none and none was given "
                "(pass head='masked_lm', … or use a class such as BertForMaskedLM)"
            )
        if cfg.head is None or cfg.head.name != name:
            # the class (or argument) decides, as loading a BertForPreTraining checkpoint into
            # transformers' BertForSequenceClassification does; the old head's options go with it
            cfg = validate_config({**cfg.model_dump(), "head": {"name": name}}, reg)
        model_cls = cls if cls.head_name is not None else _TASK_CLASSES.get(name, cls)
        head_module = build_head(cfg, reg)
        if head_module.needs_pooler and cfg.pooler is None:
            raise BuildError(f"the {name!r} head reads the pooled output, but the config has pooler: null")
        keeps_pooler = head_module.needs_pooler or (
            cfg.pooler is not None and cfg.pooler.always and not head_module.omits_pooler
        )
        backbone = BertModel._from_config(cfg, registry=reg, add_pooling_layer=keeps_pooler)
        # One config object for the model and its backbone, as in transformers; the backbone's structure was
        # fixed when it was built (it ignores `head`, and `pooler` only chose whether it has one).
        backbone.config = cfg
        init_weights(head_module, cfg.initializer_range)
        head_module.tie_weights(backbone.get_input_embeddings())  # after init: never re-draw the embeddings
        return model_cls(cfg, backbone, head_module)  # type: ignore[return-value]

    # -------------------------------------------------------------------------------------- checkpoints
    # Loading and saving: PretrainedModel.from_pretrained / load_checkpoint / save_pretrained. A backbone-only
    # checkpoint (keys without `bert.`) leaves the head newly initialised; a checkpoint of another task leaves its
    # head weights unused; both are reported by name, as transformers does; missing *backbone* weights are an error.
    def checkpoint_backbones(self) -> dict[str, EncoderModel]:
        return {f"{self.base_model_prefix}.": self.bert}

    def checkpoint_prefix(self) -> tuple[str, bool]:
        return f"{self.base_model_prefix}.", True

    def checkpoint_config(self) -> dict[str, Any]:
        """``config.json`` with ``architectures`` = transformers' class name for the head (its family's)."""
        return config_to_hf(self.config, self.bert.registry)

    def checkpoint_key_map(self) -> FamilyKeyMap:
        """The model family's key map (``config.family``), head-scoped rules for this model's head."""
        return FamilyKeyMap(self, self.config, backbone=False, registry=self.bert.registry)

    def checkpoint_companion_files(self) -> Mapping[str, str]:
        """The head's weight files of its own (:attr:`~bertblocks.core.interfaces.Head.companion_files`)."""
        return self.head.companion_files

    # ------------------------------------------------------------------------------------------- forward
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # An unset problem_type is inferred from the labels and written to the config here, before the call
        # reaches a compiled graph (torch.compile(model), model.compile(), Trainer(torch_compile=True)): written
        # inside the graph it is a graph break (the config is a pydantic model) and, read again by the next
        # call, one recompilation. This frame runs as plain Python under the compiler (run_frame_uncompiled) and the
        # helper with the compiler off; traced from a user's graph (is_compiling() a constant True) the branch
        # is gone and forward infers and writes it back as before.
        if not torch.compiler.is_compiling() and self.config.problem_type is None:  # a plain field: no frame
            # with the compiler off; when torch._dynamo was never imported nothing compiles, and `import bertblocks`
            # must not pay for importing it (tests/test_startup.py)
            # (made here, not in a helper of ours: this frame is never compiled, a helper's frame would be)
            record = _record_problem_type
            if "torch._dynamo" in sys.modules:
                record = _UNCOMPILED.get("record") or _UNCOMPILED.setdefault("record", torch.compiler.disable(record))
            record(self, args, kwargs)
        return super().__call__(*args, **kwargs)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: Any = None,
        **backbone_kwargs: Any,
    ) -> ModelOutput | tuple[Any, ...]:
        """Run the backbone and the head; with labels, also the loss. Arguments are transformers' task models'.

        Args:
            input_ids, attention_mask, token_type_ids, position_ids, head_mask, inputs_embeds: as for
                :class:`bertblocks.BertModel` (``[b, c, q]`` for multiple choice).
            labels: the head's targets (class indices, token ids with -100 to ignore, or regression values).
            next_sentence_label: the pre-training head's NSP targets ``[b]``.
            start_positions, end_positions: the QA head's span targets ``[b]``.
            output_attentions, output_hidden_states, return_dict: as for the backbone.
            num_items_in_batch: what transformers' Trainer passes for loss normalisation; accepted and ignored,
                as transformers' BERT task models do (the loss is the mean over this batch).
            backbone_kwargs: passed on to the backbone (``encoder_hidden_states``, ``encoder_attention_mask``,
                ``past_key_values``, ``use_cache``).

        Raises:
            ValueError: a label argument this head does not take, or labels of the wrong shape, dtype or range.
        """
        given = {
            name: value
            for name, value in zip(
                _LABEL_ARGUMENTS, (labels, next_sentence_label, start_positions, end_positions), strict=True
            )
            if value is not None
        }
        head = self.head
        for name in head.label_names:  # a head's own label names (ALBERT's sentence_order_label) are labels too
            if name not in given and backbone_kwargs.get(name) is not None:
                given[name] = backbone_kwargs.pop(name)
        unknown = [name for name in given if name not in head.label_names]
        if unknown:
            raise InputError(
                f"{type(self).__name__} ({self._head_label()} head) takes {', '.join(head.label_names)}; "
                f"got {', '.join(unknown)}"
            )
        if given and self.config.is_decoder:
            backbone_kwargs["use_cache"] = False  # a loss reads the whole sequence: no cache (as HF's LM head)
        if input_ids is not None:
            batch_shape = tuple(input_ids.shape[:-1])
        elif inputs_embeds is not None:
            batch_shape = tuple(inputs_embeds.shape[:-2])
        else:
            batch_shape = ()
        bert_inputs: dict[str, torch.Tensor | None] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "position_ids": position_ids,
            "inputs_embeds": inputs_embeds,
        }
        head_inputs = {name: backbone_kwargs.pop(name, None) for name in head.extra_inputs}
        if self._input_defaults:
            self._fill_defaults(bert_inputs, head_inputs, backbone_kwargs)
        inputs = head.prepare_inputs(bert_inputs)
        output = self.bert(
            **inputs,
            head_mask=head_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **backbone_kwargs,
        )
        for field in head.config_fields:  # the config is the truth; the head mirrors it for this call
            setattr(head, field, getattr(self.config, field))
        extra = {"input_ids": inputs["input_ids"]} if head.reads_input_ids else {}  # a declared capability
        extra.update(head_inputs)
        result = head(output, given, batch_shape, attention_mask=inputs["attention_mask"], **extra)
        for field in head.config_fields:  # what the head learned (HF writes problem_type back)
            value = getattr(head, field)
            if value != getattr(self.config, field):
                setattr(self.config, field, value)
        names = {f.name for f in fields(result)}
        for field in _PASSED_THROUGH:
            if field in names and getattr(result, field) is None:
                setattr(result, field, getattr(output, field))
        return result if return_dict is None or return_dict else result.to_tuple()

    def _fill_defaults(
        self,
        bert_inputs: dict[str, torch.Tensor | None],
        head_inputs: dict[str, torch.Tensor | None],
        backbone_kwargs: dict[str, Any],
    ) -> None:
        """Make each input the call left out that a default exists for (:attr:`_input_defaults`, in order), in place:
        BERT's inputs, the head's own and the backbone's extra ones."""
        for name, make in self._input_defaults.items():
            where = bert_inputs if name in bert_inputs else head_inputs if name in head_inputs else backbone_kwargs
            if where.get(name) is not None:
                continue
            value = make({**bert_inputs, **backbone_kwargs, **head_inputs}, self.config)
            if value is not None:
                where[name] = value

    # ------------------------------------------------------------------------------------------ utilities
    def _head_label(self) -> str:
        return self.config.head.name if self.config.head is not None else type(self.head).__name__

    def train(self: T, mode: bool = True) -> T:
        super().train(mode)
        self.head.training = mode  # the unregistered head object; its modules were switched above
        return self

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module | None:
        """The LM decoder (``cls.predictions.decoder``) of language-model heads, else ``None``."""
        cls_module = getattr(self, "cls", None)
        predictions = getattr(cls_module, "predictions", None)
        return getattr(predictions, "decoder", None)

    def prune_heads(self, heads_to_prune: dict[int, list[int]]) -> None:
        """Remove attention heads of the backbone for good (see :meth:`bertblocks.BertModel.prune_heads`)."""
        self.bert.prune_heads(heads_to_prune)


# ------------------------------------------------------------------------------ transformers' class names
def _forward_taking(label_names: tuple[str, ...]) -> Any:
    """``BertTaskModel.forward`` whose signature lists only ``label_names`` of the label arguments.

    Why: transformers' Trainer finds a model's label arguments in its ``forward`` signature, and only treats a
    batch as labelled (evaluation loss, metrics) when *every* one is present; transformers' classes list only
    their own (``labels`` for classification, ``start_positions``/``end_positions`` for QA).
    """
    base = BertTaskModel.forward

    def forward(self: BertTaskModel, *args: Any, **kwargs: Any) -> ModelOutput | tuple[Any, ...]:
        return base(self, *args, **kwargs)

    functools.update_wrapper(forward, base)
    signature = inspect.signature(base)
    kept = [p for name, p in signature.parameters.items() if name not in _LABEL_ARGUMENTS or name in label_names]
    forward.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    return forward


class BertForMaskedLM(BertTaskModel):
    """transformers' ``BertForMaskedLM``: the ``masked_lm`` head (no pooler; decoder tied to the embeddings)."""

    forward = _forward_taking(("labels",))


class BertForNextSentencePrediction(BertTaskModel):
    """transformers' ``BertForNextSentencePrediction``: the ``next_sentence`` head on the pooled output."""

    forward = _forward_taking(("labels",))


class BertForPreTraining(BertTaskModel):
    """transformers' ``BertForPreTraining``: the ``pretraining`` head (masked LM + next sentence)."""

    forward = _forward_taking(("labels", "next_sentence_label"))


class BertLMHeadModel(BertTaskModel):
    """transformers' ``BertLMHeadModel``: the ``causal_lm`` head (no pooler); a decoder with ``is_decoder: true``."""

    forward = _forward_taking(("labels",))


class BertForSequenceClassification(BertTaskModel):
    """transformers' ``BertForSequenceClassification``: the ``sequence_classification`` head (``problem_type``)."""

    forward = _forward_taking(("labels",))


class BertForTokenClassification(BertTaskModel):
    """transformers' ``BertForTokenClassification``: the ``token_classification`` head (no pooler)."""

    forward = _forward_taking(("labels",))


class BertForQuestionAnswering(BertTaskModel):
    """transformers' ``BertForQuestionAnswering``: the ``question_answering`` head (no pooler)."""

    forward = _forward_taking(("start_positions", "end_positions"))


class BertForMultipleChoice(BertTaskModel):
    """transformers' ``BertForMultipleChoice``: the ``multiple_choice`` head (inputs ``[b, choices, seq]``)."""

    forward = _forward_taking(("labels",))


#: head name → the class named as transformers names it (the class ``BertTaskModel.from_*`` returns)
_TASK_CLASSES: dict[str, type[BertTaskModel]] = {
    cls.head_name: cls
    for cls in (
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertLMHeadModel,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertForQuestionAnswering,
        BertForMultipleChoice,
    )
    if cls.head_name is not None
}


def task_model_class(head: str) -> type[BertTaskModel]:
    """The class for ``head``: transformers' name for a built-in head, :class:`BertTaskModel` for others."""
    return _TASK_CLASSES.get(head, BertTaskModel)


def _input_defaults(config: BertConfig, backbone: BertModel, head: Head) -> dict[str, InputDefault]:
    """The defaults of a task model's inputs: its family's for its head (``Family.input_defaults``), then the head's
    own (:attr:`~bertblocks.core.interfaces.Head.input_defaults`), each kept only where the input is one the model
    takes (BERT's, the backbone's extra inputs, the head's): a family's global tokens are made only for a model whose
    attention reads them.

    Raises:
        BuildError: the family and the head both default the same input (which one the model would use is unclear).
    """
    takes = {*_BERT_INPUTS, *backbone.extra_input_names, *head.extra_inputs}
    name = config.head.name if config.head is not None else None
    try:
        family = get_family(config.family, backbone.registry)
    except UnknownFamilyError:  # a model built with a family no plugin registers here: no family defaults
        family_defaults: Mapping[str, InputDefault] = {}
    else:
        family_defaults = family.input_defaults.get(name, {}) if name is not None else {}
    both = sorted(set(family_defaults) & set(head.input_defaults))
    if both:
        raise BuildError(
            f"the {config.family} family and the {name!r} head both make a default for {', '.join(both)}: "
            "only one of them may"
        )
    return {
        input_name: make
        for input_name, make in (*family_defaults.items(), *head.input_defaults.items())
        if input_name in takes
    }


#: the inputs of transformers' BERT task models (the ones a default may fill beyond the extra inputs)
_BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds")


def _record_problem_type(model: BertTaskModel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Write transformers' inferred ``problem_type`` to ``model.config`` when the head reads it, the config has
    none and labels are given (positionally or by name): the loss's own rule (its ``infer_problem_type``, as
    :class:`bertblocks.plugins.heads.losses.ProblemTypeLoss` has), at the same moment (the first call with
    labels)."""
    infer = getattr(getattr(model.head, "loss", None), "infer_problem_type", None)
    if infer is None or "problem_type" not in model.head.config_fields or model.config.problem_type is not None:
        return
    labels = kwargs.get("labels")
    if labels is None and len(args) > _LABELS_POSITION:
        labels = args[_LABELS_POSITION]
    width = _logits_width(model.head)
    if isinstance(labels, torch.Tensor) and width is not None:
        model.config.problem_type = infer(width, labels.dtype)


#: :func:`_record_problem_type` with the compiler off, made on first use (``torch.compiler.disable`` imports it)
_UNCOMPILED: dict[str, Callable[..., None]] = {}


def _logits_width(head: Head) -> int | None:
    """How many scores per example the head's loss reads (transformers' ``num_labels``; a plugin head may differ:
    one regression score under the default ``num_labels: 2``), from the last layer of the branch that fills the
    loss's field; ``None`` where that is not a layer with ``out_features`` (the loss then infers the type
    itself, inside the call)."""
    field = getattr(getattr(head, "loss", None), "field", None)
    if getattr(head, "choices", False):  # the scores are reshaped to [b, choices]
        return None
    for branch in getattr(head, "branches", ()):
        if field in branch.fields:
            if branch.split or not branch.modules:
                return None
            width = getattr(head.get_submodule(branch.modules[-1]), "out_features", None)  # type: ignore[attr-defined]
            return width if isinstance(width, int) else None
    return None


#: where ``labels`` comes among ``forward``'s positional arguments (after ``self``)
_LABELS_POSITION = list(inspect.signature(BertTaskModel.forward).parameters).index("labels") - 1


# the frame of BertTaskModel.__call__ runs as plain Python under the compiler and the frames it calls are compiled
# (as CompileEntry.__call__'s, whose marks then come next); without the hook (another torch) the graph starts at
# the method: the branch is traced, and the config written inside it, as before
run_frame_uncompiled(BertTaskModel.__call__.__code__)

__all__ = [
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertLMHeadModel",
    "BertTaskModel",
    "build_head",
    "task_model_class",
]
