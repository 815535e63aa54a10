"""The model methods and attributes the Hugging Face ecosystem calls, shared by every bertblocks model class.

transformers' ``Trainer``, PEFT, accelerate, ``pipeline`` and sentence-transformers call a model through
``PreTrainedModel``'s surface: ``.device``, ``.dtype``, ``num_parameters()``, ``gradient_checkpointing_enable
(gradient_checkpointing_kwargs=…)``, ``get/set_input_embeddings``, ``tie_weights``, ``resize_token_embeddings``,
``save_pretrained(state_dict=…, max_shard_size="…")``, ``push_to_hub`` … :class:`PretrainedSurface` gives a
plain ``nn.Module`` with a ``config`` that surface, behaving as transformers' does, without making it a
``PreTrainedModel``: bertblocks models stay plain modules that ``torch.compile``, DDP and FSDP accept.

The mixin goes before :class:`~bertblocks.models.pretrained.PretrainedModel` in a class's bases; loading and
saving stay there, written once, and take transformers' arguments (``dtype=``, ``num_labels=``,
``state_dict=``, ``max_shard_size="5GB"``) through the helpers of this module. A class provides ``config`` and
``get_input_embeddings()``; task models also ``get_output_embeddings()`` and a ``head``.

"""

from __future__ import annotations

import functools
import inspect
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..core.encoder import Encoder, EncoderModel
from ..errors import InputError, InputTypeError, MissingAttributeError, UnsupportedError
from ..readers import parse_yaml

#: keyword arguments of transformers' ``from_pretrained`` that bertblocks reads (the rest name config fields)
LOAD_OPTIONS = ("dtype", "torch_dtype", "device_map", "low_cpu_mem_usage", "use_safetensors", "trust_remote_code")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?B\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(value: int | str | None) -> int | None:
    """Bytes from ``max_shard_size``: an int, or transformers' strings (``"5GB"``, ``"200MB"``, ``"1GiB"``).

    Raises:
        ValueError: a string that is not a size, or a size below 1 byte.
    """
    if value is None or isinstance(value, int):
        if isinstance(value, int) and value < 1:
            raise InputError(f"max_shard_size must be at least 1 byte, got {value}")
        return value
    match = _SIZE.match(value)
    if match is None:
        raise InputError(f"max_shard_size {value!r} is not a size such as 5GB, 200MB, 1GiB or a number of bytes")
    number, unit = match.groups()
    size = int(float(number) * _UNITS[(unit or "").lower()])
    if size < 1:
        raise InputError(f"max_shard_size must be at least 1 byte, got {value!r}")
    return size


def resolve_dtype(
    value: torch.dtype | str | None,
    checkpoint_dtype: str | None = None,
    weights_dtype: torch.dtype | None = None,
) -> torch.dtype | None:
    """A ``torch.dtype`` from ``dtype=``/``torch_dtype=``: a dtype, its name (``"bfloat16"``, ``"torch.float16"``),
    or ``"auto"``: the dtype the checkpoint's ``config.json`` names (``dtype``, or the older ``torch_dtype``),
    else the dtype of its weights (``weights_dtype``: the first floating-point tensor's, transformers' rule),
    else none (keep float32).

    Raises:
        ValueError: a name that is not a floating-point torch dtype.
    """
    if value is None or isinstance(value, torch.dtype):
        return value
    if value == "auto":
        return resolve_dtype(checkpoint_dtype) if checkpoint_dtype else weights_dtype
    dtype = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype {value!r} is not a floating-point torch dtype (float32, bfloat16, float16, …)")
    return dtype


def split_load_kwargs(
    overrides: Sequence[str] | Mapping[str, Any], kwargs: Mapping[str, Any], config_fields: Sequence[str]
) -> tuple[Sequence[str] | Mapping[str, Any], dict[str, Any]]:
    """Split transformers-style ``from_pretrained`` keyword arguments into config overrides and load options.

    ``num_labels=3`` (any config field or flat alias, as transformers takes them) joins the overrides;
    :data:`LOAD_OPTIONS` are returned apart.

    Raises:
        TypeError: a keyword that is neither a load option nor a config field.
    """
    options = {k: v for k, v in kwargs.items() if k in LOAD_OPTIONS}
    fields = {k: v for k, v in kwargs.items() if k not in LOAD_OPTIONS}
    unknown = [k for k in fields if k not in config_fields]
    if unknown:
        raise InputTypeError(
            f"from_pretrained() got unexpected keyword arguments {unknown}: neither a load option "
            f"({', '.join(LOAD_OPTIONS)}) nor a config field"
        )
    if not fields:
        return overrides, options
    from ..config.flat_view import FLAT_ALIASES

    merged: dict[str, Any] = dict(overrides) if isinstance(overrides, Mapping) else {}
    if not isinstance(overrides, Mapping):
        for text in overrides:
            key, _, value = text.partition("=")
            merged[key.strip()] = parse_yaml(value, key.strip()) if value.strip() else None
    merged.update({FLAT_ALIASES.get(k, k): v for k, v in fields.items()})
    return merged, options


def config_keywords(model_fields: Iterator[str] | Sequence[str]) -> list[str]:
    """The keyword names ``from_pretrained`` accepts as config overrides: fields and flat aliases."""
    from ..config.flat_view import FLAT_ALIASES

    return [*model_fields, *FLAT_ALIASES]


def requested_dtype(options: Mapping[str, Any]) -> torch.dtype | str | None:
    """The dtype asked for with ``dtype=`` or ``torch_dtype=`` (as given: a dtype, a name or ``"auto"``).

    Raises:
        ValueError: both given and different.
    """
    dtypes = {options.get("dtype"), options.get("torch_dtype")} - {None}
    if len(dtypes) > 1:
        raise InputError(f"dtype and torch_dtype disagree: {options.get('dtype')} vs {options.get('torch_dtype')}")
    return dtypes.pop() if dtypes else None


def apply_load_options(
    model: nn.Module,
    options: Mapping[str, Any],
    checkpoint_dtype: str | None = None,
    weights_dtype: torch.dtype | None = None,
) -> None:
    """Apply ``dtype``/``torch_dtype`` and ``device_map`` (a single device) to a loaded model.

    ``checkpoint_dtype`` (the dtype ``config.json`` names) and ``weights_dtype`` (the weights' own) are what
    ``"auto"`` follows, in that order (see :func:`resolve_dtype`).

    Raises:
        ValueError: both ``dtype`` and ``torch_dtype`` given and different, or a ``device_map`` that spreads
            the model over several devices (bertblocks loads onto one).
    """
    dtype = resolve_dtype(requested_dtype(options), checkpoint_dtype, weights_dtype)
    if dtype is not None:
        model.to(dtype)
    device_map = options.get("device_map")
    if device_map is not None:
        if isinstance(device_map, Mapping):
            devices = set(device_map.values())
            if len(devices) != 1:
                raise InputError(f"device_map places the model on several devices {sorted(map(str, devices))}")
            device_map = devices.pop()
        if device_map != "auto":
            model.to(torch.device(device_map) if isinstance(device_map, str | int) else device_map)


class ForwardWithExtraInputs(functools.partial):  # type: ignore[type-arg]
    """``model.forward`` of a model whose family takes inputs beyond BERT's: the class's ``forward`` bound to the model
    (a :func:`functools.partial`, which ``torch.export`` and ``torch.compile`` read as they read any patched
    ``forward``), with a signature that lists those inputs as keyword-only parameters.

    Why: transformers' Trainer keeps only the dataset columns named in ``inspect.signature(model.forward)`` (a PEFT
    model's base model's), unless ``remove_unused_columns=False``; the class's ``forward`` takes the family's inputs
    (LayoutLM's ``bbox``, X-MOD's ``lang_ids``, Longformer's ``global_attention_mask``, a plugin's) through
    ``**kwargs``, which the Trainer does not read, and would drop those columns silently. The names come from the
    backbone's one list (:attr:`~bertblocks.core.encoder.EncoderModel.extra_input_names`, what ``forward`` checks
    against), so a new family or component is listed without touching this.

    Installed by :meth:`PretrainedSurface._list_extra_inputs` as the instance's ``forward``, only for a model that
    has such inputs (every other keeps the class's).
    """

    __signature__: inspect.Signature

    def __new__(cls, model: nn.Module, names: Sequence[str]) -> ForwardWithExtraInputs:
        self = super().__new__(cls, type(model).forward, model)
        base = inspect.signature(type(model).forward)
        parameters = list(base.parameters.values())[1:]  # without self
        taken = {p.name for p in parameters}
        extra = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation="torch.Tensor | None")
            for name in names
            if name not in taken
        ]
        kept = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
        rest = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
        self.__signature__ = base.replace(parameters=[*kept, *extra, *rest])
        return self

    def __repr__(self) -> str:
        return f"<forward of {type(self.args[0]).__name__}{self.__signature__}>"


class PretrainedSurface:
    """Mixin: transformers' ``PreTrainedModel`` surface for a bertblocks model (see the module docstring)."""

    #: the input transformers' Trainer and pipelines count tokens of
    main_input_name: ClassVar[str] = "input_ids"
    #: the loss is a mean over the micro-batch: the Trainer scales it for gradient accumulation itself, and
    #: need not pass ``num_items_in_batch`` (accepted and ignored, as transformers' BERT task models do)
    accepts_loss_kwargs: ClassVar[bool] = False
    supports_gradient_checkpointing: ClassVar[bool] = True
    #: where ``from_pretrained`` read the model from (transformers' ``name_or_path``)
    name_or_path: str = ""

    config: Any
    _input_grad_hook: Any = None

    # ------------------------------------------------------------------------------------------ reading
    @property
    def device(self) -> torch.device:
        """The device of the first parameter (the whole model lives on one)."""
        return next(self._module().parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the first floating-point parameter."""
        for p in self._module().parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.get_default_dtype()

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Unique parameters (a tied weight counts once), as transformers' ``num_parameters``.

        Args:
            only_trainable: count only parameters with ``requires_grad``.
            exclude_embeddings: leave out every ``nn.Embedding`` table (token, position and type), as
                transformers counts them.
        """
        model = self._module()
        excluded = (
            {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)} if exclude_embeddings else set()
        )
        return sum(
            p.numel() for p in model.parameters() if (p.requires_grad or not only_trainable) and id(p) not in excluded
        )

    def floating_point_ops(self, inputs: Mapping[str, Any], exclude_embeddings: bool = True) -> int:
        """transformers' estimate for the Trainer's ``total_flos``: 6 × tokens × (non-embedding) parameters."""
        tokens = inputs.get(self.main_input_name)
        count = tokens.numel() if isinstance(tokens, torch.Tensor) else 0
        return 6 * count * self.num_parameters(exclude_embeddings=exclude_embeddings)

    def _module(self) -> nn.Module:
        assert isinstance(self, nn.Module)
        return self

    def _list_extra_inputs(self, backbone: EncoderModel, head_inputs: Sequence[str] = ()) -> None:
        """Make ``self.forward``'s signature list ``backbone``'s inputs beyond BERT's and those the head reads itself
        (BigBird's ``question_lengths``; see :class:`ForwardWithExtraInputs`); a model without any keeps the class's
        ``forward``. Called once built."""
        names = tuple(dict.fromkeys((*backbone.extra_input_names, *head_inputs)))
        if names:
            model = self._module()
            model.forward = ForwardWithExtraInputs(model, names)  # type: ignore[method-assign]

    # ------------------------------------------------------------------------------ gradient checkpointing
    def activation_checkpointing_enable(
        self,
        activation_checkpointing_kwargs: Mapping[str, Any] | None = None,
        every_n_layers: int = 1,
        offload: bool = False,
    ) -> None:
        """Recompute layer activations in backward instead of storing them (training only); what transformers'
        Trainer calls for ``TrainingArguments(activation_checkpointing=True)`` (or ``gradient_checkpointing``).

        Args:
            activation_checkpointing_kwargs: options for ``torch.utils.checkpoint.checkpoint`` (default
                ``{"use_reentrant": False}``). With ``use_reentrant=True`` the inputs of the first layer must require
                grad: the input embeddings are then hooked to produce outputs that do (transformers'
                ``enable_input_require_grads``), so frozen embeddings (PEFT) still train.
            every_n_layers: checkpoint layers 0, n, 2n, … only.
            offload: keep what checkpointed layers save in host memory.

        Raises:
            ValueError: ``every_n_layers`` below 1.
        """
        if every_n_layers < 1:
            raise InputError(f"every_n_layers must be at least 1, got {every_n_layers}")
        options = {"use_reentrant": False, **(activation_checkpointing_kwargs or {})}
        for encoder in self._encoders():
            encoder.gradient_checkpointing = True
            encoder.checkpoint_options = dict(options)
            encoder.checkpoint_every = every_n_layers
            encoder.checkpoint_offload = offload
        if options.get("use_reentrant"):
            self.enable_input_require_grads()

    def activation_checkpointing_disable(self) -> None:
        for encoder in self._encoders():
            encoder.gradient_checkpointing = False

    def gradient_checkpointing_enable(
        self,
        gradient_checkpointing_kwargs: Mapping[str, Any] | None = None,
        every_n_layers: int = 1,
        offload: bool = False,
    ) -> None:
        """transformers' older name of :meth:`activation_checkpointing_enable` (same arguments)."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, every_n_layers, offload)

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing_disable()

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(encoder.gradient_checkpointing for encoder in self._encoders())

    def _encoders(self) -> list[Encoder]:
        return [m for m in self._module().modules() if isinstance(m, Encoder)]

    def enable_input_require_grads(self) -> None:
        """Make the input embeddings' output require grad (for adapters on a frozen model + checkpointing)."""

        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            output.requires_grad_(True)

        self.disable_input_require_grads()
        self._input_grad_hook = self.get_input_embeddings().register_forward_hook(hook)

    def disable_input_require_grads(self) -> None:
        if self._input_grad_hook is not None:
            self._input_grad_hook.remove()
            self._input_grad_hook = None

    # ------------------------------------------------------------------------------------ language adapters
    def set_default_language(self, language: str) -> None:
        """The language of inputs given without ``lang_ids`` (transformers' ``XmodPreTrainedModel``): every layer's
        adapters and the config (``encoder.feedforward.default_language``, written to config.json) take it.

        Raises:
            UnsupportedError: the model has no language adapters (feed-forward ``adapters``).
            InputError: ``language`` is not one of the adapters' languages.
        """
        # the modules that hold languages (the adapters feed-forward's outputs) say so with this very method
        outputs = [
            m
            for m in self._module().modules()
            if not isinstance(m, PretrainedSurface) and callable(getattr(m, "set_default_language", None))
        ]
        if not outputs:
            raise UnsupportedError("this model has no language adapters (encoder.feedforward: adapters, X-MOD's)")
        for output in outputs:
            output.set_default_language(language)
        spec = self.config.encoder.feedforward  # type: ignore[attr-defined]
        if spec.name == "adapters" and spec.__pydantic_extra__ is not None:
            spec.__pydantic_extra__["default_language"] = language

    # ------------------------------------------------------------------------------------------ embeddings
    get_input_embeddings: Any  # provided by the model class (the token embedding table)

    def get_output_embeddings(self) -> nn.Module | None:
        """The LM decoder of language-model heads; ``None`` for a backbone and other heads."""
        return None

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the token embedding table (wherever it is registered); re-tie an LM decoder to it."""
        _replace_module(self._module(), self.get_input_embeddings(), value)
        self.tie_weights()

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        """Replace the LM decoder. Raises ``AttributeError`` for a model without one."""
        old = self.get_output_embeddings()
        if old is None:
            raise MissingAttributeError(f"{type(self).__name__} has no output embeddings (no language-model head)")
        _replace_module(self._module(), old, new_embeddings)

    def tie_weights(self) -> None:
        """Tie the LM decoder to the input embeddings when ``config.tie_word_embeddings`` (and the head ties)."""
        head = getattr(self, "head", None)
        if head is not None and getattr(self.config, "tie_word_embeddings", False):
            head.tie_weights(self.get_input_embeddings())

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Grow or shrink the vocabulary, as transformers does: the first ``min(old, new)`` rows are kept; new
        rows are the mean of the old ones (``mean_resizing``) or drawn like the initialisation; an LM decoder
        (its bias too) follows, and ``config.vocab_size`` is updated.

        Args:
            new_num_tokens: the new vocabulary size (``None``: unchanged, just rounded by ``pad_to_multiple_of``).
            pad_to_multiple_of: round the size up to a multiple of this (tensor-core friendly sizes).
            mean_resizing: initialise new rows with the old rows' mean (transformers' default).

        Returns:
            The (new) input embedding table.

        Raises:
            ValueError: a size below 1, or ``pad_to_multiple_of`` that is not a positive integer.
        """
        old = self.get_input_embeddings()
        size = old.num_embeddings if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
                raise InputError(f"pad_to_multiple_of must be a positive integer, got {pad_to_multiple_of!r}")
            size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
        if size < 1:
            raise InputError(f"new_num_tokens must be at least 1, got {size}")
        if size == old.num_embeddings:
            return old
        module = self._module()
        std = float(getattr(self.config, "initializer_range", 0.02))
        decoder = self.get_output_embeddings()
        tied = decoder is not None and getattr(decoder, "weight", None) is old.weight
        if decoder is not None and isinstance(decoder, nn.Linear):
            if decoder.bias is not None:  # shared with `predictions.bias`: every name gets the new tensor
                _replace_parameter(module, decoder.bias, _resized_rows(decoder.bias, size, mean_resizing, 0.0))
            if not tied:
                _replace_parameter(module, decoder.weight, _resized_rows(decoder.weight, size, mean_resizing, std))
            decoder.out_features = size
        padding_idx = old.padding_idx if old.padding_idx is None or old.padding_idx < size else None
        new = nn.Embedding(size, old.embedding_dim, padding_idx=padding_idx, device=old.weight.device)
        new.weight = _resized_rows(old.weight, size, mean_resizing, std)
        _replace_module(module, old, new)
        self.config.vocab_size = size
        if tied:
            self.tie_weights()
        return new

    # ---------------------------------------------------------------------------------------------- saving
    #: the config fields ``from_pretrained`` takes as keywords (``num_labels=3``); none for a class whose config
    #: is not a BERT config (read by :meth:`bertblocks.models.pretrained.PretrainedModel.from_pretrained`)
    takes_config_keywords: ClassVar[bool] = True

    def push_to_hub(
        self,
        repo_id: str,
        *,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        max_shard_size: int | str | None = None,
        safe_serialization: bool = True,
    ) -> Any:
        """Save the model (:meth:`save_pretrained`) into a temporary folder and upload it to the hub repository
        ``repo_id`` (created if needed) with ``huggingface_hub``; returns its ``CommitInfo``.

        The folder uploaded is exactly what :meth:`save_pretrained` writes (``config.json`` and the weights).

        Raises:
            huggingface_hub's errors: offline (``HF_HUB_OFFLINE=1``), no token, no access.
        """
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder, max_shard_size=max_shard_size, safe_serialization=safe_serialization)
            return self._upload(
                Path(folder),
                repo_id,
                commit_message=commit_message,
                private=private,
                token=token,
                revision=revision,
                create_pr=create_pr,
            )

    @staticmethod
    def _upload(
        folder: Path,
        repo_id: str,
        *,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        create_pr: bool = False,
    ) -> Any:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message or "Upload model (bertblocks)",
            revision=revision,
            create_pr=create_pr,
        )


def _resized_rows(weight: torch.Tensor, size: int, mean_resizing: bool, std: float) -> nn.Parameter:
    """``weight`` with ``size`` rows: the old rows first; new ones the old mean (or normal(0, std))."""
    old = weight.shape[0]
    with torch.no_grad():
        new = weight.new_empty((size, *weight.shape[1:]))
        keep = min(old, size)
        new[:keep] = weight[:keep]
        if size > old:
            if mean_resizing:
                new[old:] = weight.float().mean(dim=0).to(weight.dtype)
            else:
                new[old:].normal_(0.0, std) if std else new[old:].zero_()
    return nn.Parameter(new, requires_grad=weight.requires_grad)


def _replace_parameter(root: nn.Module, old: torch.Tensor, new: nn.Parameter) -> None:
    """Point every registration of the parameter ``old`` (a tied one has several) at ``new``."""
    for module in root.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is old:
                module._parameters[name] = new


def _replace_module(root: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Register ``new`` wherever ``old`` is a child module."""
    found = False
    for module in root.modules():
        for name, child in list(module._modules.items()):
            if child is old:
                module._modules[name] = new
                found = True
    if not found:
        raise InputError(f"{type(old).__name__} is not a submodule of {type(root).__name__}")


__all__ = [
    "LOAD_OPTIONS",
    "PretrainedSurface",
    "apply_load_options",
    "config_keywords",
    "parse_size",
    "requested_dtype",
    "resolve_dtype",
    "split_load_kwargs",
]
