"""A conformance suite for plugin authors: does a registered component honour its interface?

Every check places the component in a tiny model (hidden 32, 2 layers, 4 heads) or calls it directly, and
compares it with what the interface promises: output shapes and dtypes, padding masks respected, the same
answer twice with dropout off, gradients for every parameter, weights that survive a checkpoint round trip,
cache equivalence for decoders, equivalence with the built-in ``eager`` kernel for attention backends, and
``torch.compile``. A check raises :class:`ConformanceError` (an ``AssertionError``) saying what broke, or
:class:`ConformanceSkip` with the reason it does not apply (e.g. a backend that does not claim causal
support is not run as a decoder).

Example (a plugin's own test module; see ``docs/plugins/testing-a-plugin.md``)::

    import pytest
    from bertblocks.registry import Registry
    from bertblocks.testing import ConformanceSuite

    import my_plugin

    registry = Registry(load_entry_points=False)
    registry.register(my_plugin)
    suite = ConformanceSuite(registry, options={("backend", "flash"): {"block": 64}})

    @pytest.mark.parametrize("case", suite.params(provider="my_plugin"))
    def test_conformance(case):
        case.run()

pytest is imported only inside :meth:`Case.run` (to turn a skip into ``pytest.skip``) and
:meth:`ConformanceSuite.params`, so importing this module does not need it.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.component import KINDS, Component
from ..core.interfaces import AttentionBackend, Head, Positions, PositionScheme
from ..hf.weights import LoadingInfo
from ..models.backbone import BertModel
from ..registry import BuildError, Registry, get_registry, validate_config

#: float32 tolerance, as for HF parity
ATOL = 1e-5

#: the tiny model every model-level check builds; dropout is non-zero so that eval/train differences show
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 32,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    # a wide initialiser makes attention sharply non-uniform, so a wrong mask or position shows in the numbers
    "initializer_range": 0.2,
    "encoder": {"num_layers": 2, "attention": {"num_heads": 4}, "feedforward": {"intermediate_size": 37}},
}


class ConformanceError(AssertionError):
    """A component does not do what its interface promises."""


class ConformanceSkip(Exception):  # noqa: N818 - a skip, not an error
    """A check does not apply to this component; the message says why."""


# ------------------------------------------------------------------------------------------------ subjects
@dataclass
class Subject:
    """The component under test and how to place it in a config.

    Attributes:
        component: the registered component.
        options: its plugin options for the tests (defaults of its options model when empty).
        registry: where the tiny models look components up.
        compile_backend: the ``torch.compile`` backend of :func:`check_compile`.
        base: changes merged over :data:`TINY_CONFIG` before the component is placed: the rest of the config
            the component needs (``{"position": "rope"}`` for an attention that requires rotary positions).
    """

    component: Component
    options: dict[str, Any]
    registry: Registry
    compile_backend: str = "inductor"
    base: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.component.kind

    @property
    def name(self) -> str:
        return self.component.name

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, **self.options}

    def config(self, **changes: Any) -> dict[str, Any]:
        """The tiny config (with :attr:`base` merged over it) with this component in its place, plus top-level
        ``changes``."""
        cfg = _merged(TINY_CONFIG, self.base)
        enc = cfg["encoder"]
        where = {
            "embedding": lambda: cfg.__setitem__("embedding", self.spec()),
            "position": lambda: cfg.__setitem__("position", self.spec()),
            "attention": lambda: enc["attention"].update(self.spec()),
            "backend": lambda: enc["attention"].__setitem__("backend", self.spec()),
            "feedforward": lambda: enc["feedforward"].update(self.spec()),
            "activation": lambda: enc["feedforward"].__setitem__("activation", self.name),
            "norm": lambda: enc.__setitem__("norm", self.spec()),
            "layer": lambda: enc.__setitem__("layer", self.spec()),
            "pooler": lambda: cfg.__setitem__("pooler", self.spec()),
            "head": lambda: cfg.__setitem__("head", self.spec()),
        }
        if self.kind == "family":
            # the family's own translation of the tiny config: a config the family can represent
            from ..hf.config_json import config_from_hf
            from ..hf.families import get_family

            family = get_family(self.name, self.registry, source=None)
            base = validate_config(cfg, self.registry)
            cfg = config_from_hf({**family.config_to_hf(base), "model_type": self.name}, self.registry)
        else:
            where[self.kind]()
        cfg.update(changes)
        return cfg

    def model(self, seed: int = 0, config: Mapping[str, Any] | None = None, **changes: Any) -> nn.Module:
        """A tiny model holding this component (a task model for a head), initialised from ``seed``, in eval
        mode; built from ``config`` when given, else from :meth:`config` with ``changes``."""
        torch.manual_seed(seed)
        cfg = dict(config) if config is not None else self.config(**changes)
        if self.kind == "head":
            from ..models.task_models import BertTaskModel

            return BertTaskModel.from_config(cfg, head=self.name, registry=self.registry).eval()
        return BertModel.from_config(cfg, registry=self.registry).eval()

    def reload(self, directory: str) -> tuple[nn.Module, LoadingInfo]:
        """The model :meth:`model` saved to ``directory``, loaded back with its loading report."""
        if self.kind == "head":
            from ..models.task_models import BertTaskModel

            return BertTaskModel.from_pretrained(  # type: ignore[return-value]
                directory, head=self.name, registry=self.registry, output_loading_info=True
            )
        return BertModel.from_pretrained(directory, registry=self.registry, output_loading_info=True)  # type: ignore[return-value]

    def make(self, **kwargs: Any) -> Any:
        """Call the component's factory directly with validated options and ``kwargs``."""
        return self.component.factory(**kwargs, options=self.component.options.model_validate(self.options))


# ------------------------------------------------------------------------------------------------- helpers
def _merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in, nested mappings key by key (a copy; neither input changes)."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _batch(seed: int = 0, b: int = 3, length: int = 9, vocab: int = 99) -> dict[str, torch.Tensor]:
    """Padded batch: row 1 loses its last 3 tokens, row 2 its last 5 (and so on, every third row)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, length, dtype=torch.long)
    mask[1::3, -3:] = 0
    mask[2::3, -5:] = 0
    return {
        "input_ids": torch.randint(1, vocab, (b, length), generator=g),
        "attention_mask": mask,
        "token_type_ids": torch.randint(0, 2, (b, length), generator=g),
    }


def _inputs(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """A padded batch for ``model``: ``[3, 9]``, or ``[3, 2, 9]`` for a head that reshapes its inputs (multiple
    choice overrides :meth:`~bertblocks.core.interfaces.Head.prepare_inputs`)."""
    head = getattr(model, "head", None)
    # a head may override prepare_inputs only to read them (ELECTRA's discriminator keeps the mask): it says so
    reshapes = getattr(head, "reshapes_inputs", True)
    if isinstance(head, Head) and type(head).prepare_inputs is not Head.prepare_inputs and reshapes:
        return {k: v.view(3, 2, -1) for k, v in _batch(seed, b=6).items()}
    return _batch(seed)


#: output fields that are not the component's answer (passed through, or needing labels)
_NOT_COMPARED = ("loss", "hidden_states", "attentions", "cross_attentions", "past_key_values")


def _outputs(out: Any) -> dict[str, torch.Tensor]:
    """The floating-point output tensors by field name (``last_hidden_state``, ``pooler_output``, ``logits``, …)."""
    return {
        k: v for k, v in out.items() if k not in _NOT_COMPARED and isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def _comparable(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token outputs (leading shape = the mask's) at real positions only: padded positions have no defined
    value (an unpadded path may leave zeros there). Sequence-level outputs whole."""
    if x.shape[: mask.dim()] == mask.shape:
        return x[mask.bool()]
    return x


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise ConformanceError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def _close(what: str, got: torch.Tensor, want: torch.Tensor, atol: float = ATOL) -> None:
    diff = _diff(got, want)
    if not diff <= atol:  # also catches NaN
        raise ConformanceError(f"{what}: max abs difference {diff:.3g} > {atol:g}")


def _close_outputs(what: str, got: Any, want: Any, mask: torch.Tensor, atol: float = ATOL) -> None:
    mine, theirs = _outputs(got), _outputs(want)
    _expect(mine.keys() == theirs.keys(), f"{what}: output fields differ ({sorted(mine)} vs {sorted(theirs)})")
    for name, value in mine.items():
        _close(f"{what} ({name})", _comparable(value, mask), _comparable(theirs[name], mask), atol)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


@torch.no_grad()
def _run(model: nn.Module, **inputs: Any) -> Any:
    return model(**inputs)


def _without_dropout(subject: Subject, model: nn.Module) -> nn.Module:
    """The same model (same weights) built with every dropout probability at zero."""
    cfg = subject.config(hidden_dropout_prob=0.0)
    cfg["encoder"]["attention"]["dropout"] = 0.0
    quiet = subject.model(config=cfg)
    quiet.load_state_dict(model.state_dict())
    return quiet


# ------------------------------------------------------------------------------------ model-level checks
def check_shapes_and_dtypes(subject: Subject) -> None:
    """Outputs have BERT's shapes (leading dimensions those of the input), follow the model's dtype (float32
    and float64) and are finite."""
    hidden = TINY_CONFIG["hidden_size"]
    layers = TINY_CONFIG["encoder"]["num_layers"]
    for dtype in (torch.float32, torch.float64):
        model = subject.model().to(dtype)
        inputs = _inputs(model)
        lead = tuple(inputs["attention_mask"].shape[:-1])
        b, q = inputs["input_ids"].shape[-2:]
        out = _run(model, **inputs, output_hidden_states=True)
        outputs = _outputs(out)
        _expect(bool(outputs), f"the output has no floating-point tensors: {list(out.keys())}")
        for name, value in outputs.items():
            _expect(tuple(value.shape[: len(lead)]) == lead, f"{name} is {tuple(value.shape)}; must start with {lead}")
            _expect(value.dtype == dtype, f"a {dtype} model returned a {value.dtype} {name}")
            _expect(bool(torch.isfinite(value).all()), f"non-finite values in {name} ({dtype})")
        _expect(len(out.hidden_states) == layers + 1, "hidden_states must hold the embeddings and every layer")
        if subject.kind == "head":
            continue
        seq = out.last_hidden_state
        _expect(tuple(seq.shape) == (b, q, hidden), f"last_hidden_state is {tuple(seq.shape)}, not {(b, q, hidden)}")
        if out.pooler_output is not None:
            pooled = out.pooler_output
            _expect(tuple(pooled.shape) == (b, hidden), f"pooler_output is {tuple(pooled.shape)}, not {(b, hidden)}")


def check_padding_mask(subject: Subject) -> None:
    """Changing the tokens at padded positions changes no output at real positions (nor pooled ones)."""
    model = subject.model()
    inputs = _inputs(model)
    other = {k: v.clone() for k, v in inputs.items()}
    padded = inputs["attention_mask"] == 0
    g = torch.Generator().manual_seed(1)
    other["input_ids"][padded] = torch.randint(1, 99, (int(padded.sum()),), generator=g)
    other["token_type_ids"][padded] = 1 - other["token_type_ids"][padded]
    _close_outputs(
        "outputs after changing padded tokens", _run(model, **other), _run(model, **inputs), inputs["attention_mask"]
    )


def check_batch_independence(subject: Subject) -> None:
    """Each example gives the same outputs alone (without its padding) as inside a padded batch."""
    model = subject.model()
    inputs = _inputs(model)
    together = _run(model, **inputs)
    mask = inputs["attention_mask"]
    for i in range(mask.shape[0]):
        n = int(mask[i].sum()) if mask.dim() == 2 else mask.shape[-1]  # choices keep their shared length
        alone = _run(model, **{k: v[i : i + 1, ..., :n] for k, v in inputs.items()})
        row = {k: v[i : i + 1] for k, v in _outputs(together).items()}
        for name, value in _outputs(alone).items():
            want = row[name]
            if value.shape != want.shape and mask.dim() == 2:  # per-token: the real positions of the row
                want = want[:, :n]
            _close(f"example {i} alone vs in the batch ({name})", value, want)


def check_determinism(subject: Subject) -> None:
    """Dropout off means the same answer: two eval runs agree exactly, and training mode with every dropout
    probability at zero agrees with eval mode."""
    model = subject.model()
    inputs = _inputs(model)
    first, second = _outputs(_run(model, **inputs)), _outputs(_run(model, **inputs))
    for name, value in first.items():
        _expect(torch.equal(value, second[name]), f"two eval-mode runs on the same input differ ({name})")
    quiet = _without_dropout(subject, model)
    eval_out = _run(quiet.eval(), **inputs)
    _close_outputs(
        "training mode with dropout 0 vs eval mode", _run(quiet.train(), **inputs), eval_out, inputs["attention_mask"]
    )


def check_gradients(subject: Subject) -> None:
    """Every parameter receives a finite gradient (an unused parameter breaks DDP)."""
    model = subject.model().train()
    outputs = _outputs(model(**_inputs(model)))
    loss = sum(value.pow(2).mean() for value in outputs.values())
    loss.backward()  # type: ignore[union-attr]
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    _expect(not unused, f"parameters without a gradient (unused; DDP would fail): {', '.join(unused)}")
    bad = [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    _expect(not bad, f"non-finite gradients: {', '.join(bad)}")


def check_checkpoint_roundtrip(subject: Subject) -> None:
    """``save_pretrained`` then ``from_pretrained`` gives the same model: no missing or unexpected keys, the same
    outputs (the component's options travel in ``config.json``)."""
    model = subject.model(seed=3)
    inputs = _inputs(model)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)  # type: ignore[operator]
        loaded, info = subject.reload(directory)
    _expect(not info.missing_keys, f"keys missing after the round trip: {info.missing_keys}")
    _expect(not info.unexpected_keys, f"unexpected keys after the round trip: {info.unexpected_keys}")
    _expect(loaded.config == model.config, "the config changed in the round trip")
    _close_outputs(
        "outputs after save/load", _run(loaded.eval(), **inputs), _run(model, **inputs), inputs["attention_mask"]
    )


def check_family_round_trip(subject: Subject) -> None:
    """A family's config.json and checkpoint both ways: the config comes back equal, and a model's tensors go
    into the family's checkpoint keys and back unchanged (every key, every value)."""
    from ..families.keymap import BACKBONE_PREFIX, Shared
    from ..hf.config_json import config_from_hf, config_to_hf
    from ..hf.families import add_prefix, checkpoint_to_model, get_family, model_to_checkpoint

    config = validate_config(subject.config(), subject.registry)
    reg = subject.registry
    back = validate_config(config_from_hf(config_to_hf(config, reg), reg), reg)
    _expect(back == config, "the config changed going through the family's config.json")
    model = BertModel.from_config(config, registry=subject.registry)
    if any(isinstance(rule, Shared) for rule in get_family(subject.name, reg, source=None).key_map.rules):
        # the format stores one layer for all (ALBERT): give the model layers that agree, as a shared one would
        for layer in model.encoder.layer[1:]:
            layer.load_state_dict(model.encoder.layer[0].state_dict())
    state = add_prefix(model.state_dict(), BACKBONE_PREFIX)
    stored = model_to_checkpoint(state, config, registry=subject.registry)
    shapes = {k: v.shape for k, v in state.items()}
    again = checkpoint_to_model(stored, config, shapes, registry=subject.registry)
    _expect(set(again) == set(state), f"keys changed in the key-map round trip: {sorted(set(again) ^ set(state))}")
    for key, tensor in state.items():
        _expect(torch.equal(again[key], tensor), f"{key} changed in the key-map round trip")


def check_cache_equivalence(subject: Subject) -> None:
    """As a decoder: decoding a prefix and then the rest (in a chunk, then token by token) through the KV
    cache gives what one pass over the whole sequence gives, with and without padding."""
    try:
        model = subject.model(is_decoder=True)
    except BuildError as e:
        raise ConformanceSkip(f"cannot be built as a decoder: {e}") from None
    ids = _batch()["input_ids"]
    length, prefix = ids.shape[1], 4
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding: the only padding a decoder sees in generation
    for attention_mask in (None, mask):
        extra = {} if attention_mask is None else {"attention_mask": attention_mask}
        full = _run(model, input_ids=ids, **extra).last_hidden_state
        steps = [(0, prefix), (prefix, prefix + 2), *((t, t + 1) for t in range(prefix + 2, length))]
        cache = None
        for start, stop in steps:
            step_extra = {} if attention_mask is None else {"attention_mask": attention_mask[:, :stop]}
            out = _run(model, input_ids=ids[:, start:stop], past_key_values=cache, use_cache=True, **step_extra)
            cache = out.past_key_values
            got, want = out.last_hidden_state, full[:, start:stop]
            if attention_mask is not None:  # padded rows have no defined output
                keep = attention_mask[:, start:stop].bool()
                got, want = got[keep], want[keep]
            padding = "padded" if attention_mask is not None else "unpadded"
            _close(f"{padding} tokens {start}..{stop - 1} through the cache vs one pass", got, want)


def check_compile(subject: Subject, backend: str | None = None) -> None:
    """``torch.compile`` (graph breaks allowed) runs the model and matches eager mode.

    ``backend`` defaults to the subject's ``compile_backend``: ``inductor`` generates and compiles C++
    (seconds per model); ``aot_eager`` traces the same graphs (where plugins break) without code generation.
    """
    import torch._dynamo

    backend = backend or subject.compile_backend
    cfg = subject.config()
    cfg["encoder"]["num_layers"] = 1  # tracing time grows with the (unrolled) layers; one shows the component
    model = subject.model(config=cfg)
    inputs = _inputs(model)
    want = _run(model, **inputs)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend)
        got = _run(compiled, **inputs)
    finally:
        torch._dynamo.reset()
    _close_outputs(f"torch.compile(backend={backend!r}) vs eager", got, want, inputs["attention_mask"])


# -------------------------------------------------------------------------------- component-level checks
def _reference_backend(registry: Registry) -> AttentionBackend:
    return registry.get("backend", "eager").factory(options=registry.get("backend", "eager").options())


def _qkv(
    b: int = 2, h: int = 4, q: int = 7, k: int = 7, d: int = 8, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g).to(dtype) * 1.5 for n in (q, k, k))  # type: ignore[return-value]


def _masks(b: int, h: int, q: int, k: int) -> dict[str, torch.Tensor | None]:
    """The additive masks a backend must take: none, padding ``[b, 1, 1, k]``, a per-query ``[b, 1, q, k]``
    padding mask, and a position-bias-like float term ``[b, h, q, k]`` plus padding."""
    low = torch.finfo(torch.float32).min
    padding = torch.zeros(b, 1, 1, k)
    padding[-1, ..., -3:] = low
    per_query = torch.zeros(b, 1, q, k)
    per_query[0, :, 1, :2] = low
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(b, h, q, k, generator=g) + padding
    return {"no mask": None, "padding [b,1,1,k]": padding, "per-query [b,1,q,k]": per_query, "bias [b,h,q,k]": bias}


def check_backend_eager_equivalence(subject: Subject) -> None:
    """The backend computes softmax attention: it matches the built-in ``eager`` kernel with every kind of
    additive mask (float32 tolerance)."""
    backend = subject.make()
    reference = _reference_backend(subject.registry)
    query, key, value = _qkv()
    for label, mask in _masks(2, 4, 7, 7).items():
        kwargs: dict[str, Any] = {"mask": mask, "scale": 8**-0.5, "dropout_p": 0.0, "is_causal": False}
        got, _ = backend(query, key, value, need_weights=False, **kwargs)
        want, _ = reference(query, key, value, need_weights=False, **kwargs)
        _expect(
            tuple(got.shape) == tuple(query.shape), f"output shape {tuple(got.shape)} for queries {tuple(query.shape)}"
        )
        _close(f"output vs eager ({label})", got, want)


def check_backend_attention_weights(subject: Subject) -> None:
    """A backend claiming ``attention_weights`` returns post-softmax probabilities ``[b, h, q, k]`` equal to
    eager's; one that does not returns ``None``."""
    backend: AttentionBackend = subject.make()
    query, key, value = _qkv()
    mask = _masks(2, 4, 7, 7)["bias [b,h,q,k]"]
    kwargs: dict[str, Any] = {"mask": mask, "scale": 8**-0.5, "dropout_p": 0.0, "is_causal": False}
    _, weights = backend(query, key, value, need_weights=True, **kwargs)
    if not backend.capabilities.attention_weights:
        _expect(weights is None, "attention_weights=False in the capabilities, yet weights were returned")
        raise ConformanceSkip("the backend does not claim attention_weights (and returned none: correct)")
    _expect(weights is not None, "capabilities claim attention_weights, but need_weights=True returned None")
    _, want = _reference_backend(subject.registry)(query, key, value, need_weights=True, **kwargs)
    _close("attention weights vs eager", weights, want)
    _close("attention weights rows sum to 1", weights.sum(-1), torch.ones_like(weights[..., 0]))


def check_backend_causal(subject: Subject) -> None:
    """A backend claiming ``causal`` matches eager with ``is_causal=True``, and aligns the causal mask
    bottom-right when there are fewer queries than keys (the queries are the last ones, as under a cache)."""
    backend: AttentionBackend = subject.make()
    if not backend.capabilities.causal:
        raise ConformanceSkip("the backend does not claim causal support")
    reference = _reference_backend(subject.registry)
    query, key, value = _qkv(q=7, k=7)
    kwargs: dict[str, Any] = {"scale": 8**-0.5, "dropout_p": 0.0, "is_causal": True, "need_weights": False}
    for label, mask in (("no mask", None), ("padding", _masks(2, 4, 7, 7)["padding [b,1,1,k]"])):
        full, _ = backend(query, key, value, mask=mask, **kwargs)
        _close(f"causal output vs eager ({label})", full, reference(query, key, value, mask=mask, **kwargs)[0])
        tail, _ = backend(query[:, :, 4:], key, value, mask=mask, **kwargs)
        _close(f"last 3 queries over 7 keys vs the full causal pass ({label})", tail, full[:, :, 4:])


def check_backend_dropout(subject: Subject) -> None:
    """A backend claiming ``dropout`` changes its output when ``dropout_p > 0``, reproducibly under a seed."""
    backend: AttentionBackend = subject.make()
    if not backend.capabilities.dropout:
        raise ConformanceSkip("the backend does not claim dropout support")
    query, key, value = _qkv()
    kwargs: dict[str, Any] = {"mask": None, "scale": 8**-0.5, "is_causal": False, "need_weights": False}
    plain, _ = backend(query, key, value, dropout_p=0.0, **kwargs)
    torch.manual_seed(7)
    first, _ = backend(query, key, value, dropout_p=0.5, **kwargs)
    torch.manual_seed(7)
    second, _ = backend(query, key, value, dropout_p=0.5, **kwargs)
    _expect(_diff(first, plain) > 1e-3, "dropout_p=0.5 left the output unchanged")
    _close("two dropout runs under the same seed", first, second, atol=0.0)


def check_position_scheme(subject: Subject) -> None:
    """The scheme's modules have the documented shapes, and its attention bias for queries after a cache is
    the matching rows of the bias over the whole sequence (what makes it correct under a KV cache)."""
    scheme: PositionScheme = subject.make(max_positions=64)
    _expect(isinstance(scheme, PositionScheme), f"factory returned {type(scheme).__name__}, not a PositionScheme")
    table = scheme.embedding(32)
    if table is not None:
        ids = torch.arange(9)[None].expand(3, 9)
        emb = table(ids)
        _expect(tuple(emb.shape) == (3, 9, 32), f"position embedding of [3, 9] ids is {tuple(emb.shape)}")
    shared = scheme.shared_bias(4)
    if shared is not None:
        for dtype in (torch.float32, torch.float64):
            whole = shared(Positions.contiguous(9, 0, torch.device("cpu")), dtype)
            _expect(
                whole.dim() == 4 and whole.shape[1:] == (4, 9, 9) and whole.shape[0] in (1, 3),
                f"shared bias for 4 heads over 9 tokens must be [1|b, 4, 9, 9]; got {tuple(whole.shape)}",
            )
            _expect(whole.dtype == dtype, f"shared bias is {whole.dtype} when {dtype} was asked")
            tail = shared(Positions.contiguous(4, 5, torch.device("cpu")), dtype)
            _close(
                f"shared bias of 4 queries after 5 cached keys vs rows 5.. of the whole ({dtype})",
                tail,
                whole[:, :, 5:],
            )
    bias = scheme.attention_bias(4, 8)
    _expect(
        scheme.adds_score_bias is None or (bias is not None) == scheme.adds_score_bias,
        f"adds_score_bias is {scheme.adds_score_bias} but attention_bias returned "
        f"{'a bias' if bias is not None else 'None'}: declare what the scheme contributes",
    )
    if bias is None:
        if table is None and shared is None and scheme.layer_terms(0, 4, 8).rotary is None:
            raise ConformanceSkip("the scheme adds no embedding, no score bias and no rotation")
        return
    for dtype in (torch.float32, torch.float64):
        query, key, _ = _qkv(b=2, h=4, q=9, k=9, dtype=dtype)
        full = bias(query, key, Positions.contiguous(9, 0, query.device))
        _expect(full.dim() == 4, f"bias must be 4-D [b|1, h|1, q, k]; got {tuple(full.shape)}")
        _expect(
            all(n in (1, want) for n, want in zip(full.shape, (2, 4, 9, 9), strict=True)) and full.shape[-2:] == (9, 9),
            f"bias of shape {tuple(full.shape)} does not broadcast to [b, h, q, k] = [2, 4, 9, 9]",
        )
        _expect(full.dtype == dtype, f"bias is {full.dtype} for {dtype} queries")
        tail = bias(query[:, :, 5:], key, Positions.contiguous(4, 5, query.device))
        _close(f"bias of 4 queries after 5 cached keys vs rows 5.. of the full bias ({dtype})", tail, full[:, :, 5:])


def _rotary_of(subject: Subject) -> Any:
    scheme: PositionScheme = subject.make(max_positions=64)
    rotary = scheme.layer_terms(0, 4, 8).rotary
    if rotary is None:
        raise ConformanceSkip("the scheme does not rotate queries and keys")
    return rotary


def check_rotary_shift_invariance(subject: Subject) -> None:
    """A rotation makes scores depend on positions only through their difference: shifting every position by
    the same amount (a cache offset, a later packed sequence) leaves ``q·k`` unchanged, while a rotation that
    ignored positions would be caught by the second half (scores at other distances must differ)."""
    rotary = _rotary_of(subject)
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.float64):
        query, key = (torch.randn(2, 9, 4, 8, generator=g).to(dtype) for _ in range(2))  # [B, t, h, d]
        base = torch.arange(9)[None].expand(2, 9)
        with torch.no_grad():
            q0, k0 = rotary(query, key, base)
            q1, k1 = rotary(query, key, base + 17)
            _expect(q0.shape == query.shape and k0.shape == key.shape, "rotation changed the shape of q or k")
            _expect(q0.dtype == dtype, f"rotation of {dtype} queries returned {q0.dtype}")
            scores = torch.einsum("bqhd,bkhd->bhqk", q0, k0)
            _close(
                f"scores with every position shifted by 17 ({dtype})", torch.einsum("bqhd,bkhd->bhqk", q1, k1), scores
            )
            q2, k2 = rotary(query, key, base.flip(-1))
            _expect(
                _diff(torch.einsum("bqhd,bkhd->bhqk", q2, k2), scores) > 1e-3,
                "reversing the positions left every score unchanged: the rotation ignores positions",
            )


def check_position_cache_chunks(subject: Subject) -> None:
    """As a decoder, feeding the sequence through the KV cache in chunks of 1, of 3, and all at once gives what
    one pass gives: positions continue exactly after the cache, whatever the chunk size."""
    try:
        model = subject.model(is_decoder=True)
    except BuildError as e:
        raise ConformanceSkip(f"cannot be built as a decoder: {e}") from None
    ids = _batch(b=2, length=8)["input_ids"]
    full = _run(model, input_ids=ids).last_hidden_state
    for size in (1, 3, ids.shape[1]):
        cache, pieces = None, []
        for start in range(0, ids.shape[1], size):
            out = _run(model, input_ids=ids[:, start : start + size], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            pieces.append(out.last_hidden_state)
        _close(f"chunks of {size} through the cache vs one pass", torch.cat(pieces, dim=1), full)


def check_packed_positions(subject: Subject) -> None:
    """A padded batch run packed (``encoder.packing: always``: real tokens laid end to end, each sequence's
    positions restarting at 0) equals the padded run at every real position, with default and with explicit
    ``position_ids``."""
    model = subject.model()
    cfg = subject.config()
    cfg["encoder"]["packing"] = "always"
    packed = subject.model(config=cfg)
    packed.load_state_dict(model.state_dict())
    cfg["encoder"]["packing"] = "never"
    padded = subject.model(config=cfg)
    padded.load_state_dict(model.state_dict())
    inputs = _batch()
    # rows spaced differently: a scheme that dropped them (or took the packed index for a position) shows it
    explicit = {**inputs, "position_ids": torch.arange(9)[None] * torch.tensor([[1], [2], [3]])}
    for label, batch in (("default positions", inputs), ("explicit position_ids", explicit)):
        _close_outputs(
            f"packed vs padded batch ({label})", _run(packed, **batch), _run(padded, **batch), inputs["attention_mask"]
        )


def check_embedding(subject: Subject) -> None:
    """``inputs_embeds`` gives what ``input_ids`` gives, and embedding the tail with ``past_length`` gives the
    tail of the whole sequence (positions continue after a cache)."""
    emb = subject.model().embeddings
    inputs = _batch()
    ids, types = inputs["input_ids"], inputs["token_type_ids"]
    with torch.no_grad():
        whole = emb(ids, types, None, None)
        via_embeds = emb(None, types, None, emb.input_embeddings()(ids))
        tail = emb(ids[:, 4:], types[:, 4:], None, None, past_length=4)
    _expect(tuple(whole.shape) == (*ids.shape, 32), f"embeddings of {tuple(ids.shape)} ids are {tuple(whole.shape)}")
    _close("inputs_embeds vs input_ids", via_embeds, whole)
    _close("tail with past_length=4 vs the whole sequence", tail, whole[:, 4:])


def check_attention_module(subject: Subject) -> None:
    """Zeroing a head with ``head_mask`` equals pruning it, and probabilities come back as ``[b, h, q, k]``
    rows summing to one (eager backend)."""
    cfg = subject.config()
    cfg["encoder"]["attention"]["backend"] = "eager"
    torch.manual_seed(0)
    model = BertModel.from_config(cfg, registry=subject.registry).eval()
    inputs = _batch()
    head_mask = torch.ones(2, 4)
    head_mask[:, 0] = 0.0
    out = _run(model, **inputs, head_mask=head_mask, output_attentions=True)
    for weights in out.attentions:
        _expect(tuple(weights.shape) == (3, 4, 9, 9), f"attention weights are {tuple(weights.shape)}, not (3, 4, 9, 9)")
    plain = _run(model, **inputs, output_attentions=True)
    for weights in plain.attentions:
        _close("attention probabilities sum to 1", weights.sum(-1), torch.ones(3, 4, 9))
    model.prune_heads({0: [0], 1: [0]})
    pruned = _run(model, **inputs)
    _close("head_mask zeroing head 0 vs pruning head 0", pruned.last_hidden_state, out.last_hidden_state)


def check_feedforward_position_wise(subject: Subject) -> None:
    """The block acts on each position alone: permuting positions permutes the output, and running it in
    chunks (``chunk_size_feed_forward``) changes nothing."""
    model = subject.model()
    layer = model.encoder.layer[0]
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 9, 32, generator=g)
    perm = torch.randperm(9, generator=g)
    with torch.no_grad():
        out = layer.output(layer.intermediate(hidden), hidden)
        permuted = layer.output(layer.intermediate(hidden[:, perm]), hidden[:, perm])
    _expect(tuple(out.shape) == (3, 9, 32), f"feed-forward output is {tuple(out.shape)}, not (3, 9, 32)")
    _close("permuted positions", permuted, out[:, perm])
    cfg = subject.config()
    cfg["encoder"]["chunk_size_feed_forward"] = 2
    torch.manual_seed(0)
    chunked = BertModel.from_config(cfg, registry=subject.registry).eval()
    chunked.load_state_dict(model.state_dict())
    inputs = _batch()
    _close(
        "chunk_size_feed_forward=2 vs none",
        _run(chunked, **inputs).last_hidden_state,
        _run(model, **inputs).last_hidden_state,
    )


def check_activation(subject: Subject) -> None:
    """Element-wise: shape kept, permutation-equivariant, float64 in gives float64 out (matching float32)."""
    act = subject.make()
    _expect(isinstance(act, nn.Module), f"factory returned {type(act).__name__}, not an nn.Module")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 6, generator=g) * 3
    perm = torch.randperm(x.numel(), generator=g)
    y = act(x)
    _expect(y.shape == x.shape, f"activation changed the shape {tuple(x.shape)} → {tuple(y.shape)}")
    _close("permuted elements", act(x.flatten()[perm]), y.flatten()[perm])
    y64 = act(x.double())
    _expect(y64.dtype == torch.float64, f"float64 input gave {y64.dtype}")
    _close("float64 vs float32", y64, y, atol=1e-5)


def check_pooler(subject: Subject) -> None:
    """``[b, q, H]`` (with a padding mask) → ``[b, H]``; states at padded positions do not change the result."""
    pooler = subject.model().pooler
    if pooler is None:
        raise ConformanceSkip("the model has no pooler")
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 9, 32, generator=g)
    mask = _batch()["attention_mask"]
    changed = hidden.clone()
    changed[mask == 0] = torch.randn(int((mask == 0).sum()), 32, generator=g)
    with torch.no_grad():
        pooled = pooler(hidden, mask)
        _expect(tuple(pooled.shape) == (3, 32), f"pooled output is {tuple(pooled.shape)}, not (3, 32)")
        _close("pooled output after changing padded states", pooler(changed, mask), pooled)


# ---------------------------------------------------------------------------------------------- the suite
MODEL_KINDS = (
    "embedding",
    "position",
    "attention",
    "backend",
    "feedforward",
    "activation",
    "norm",
    "layer",
    "pooler",
    "head",
)
CACHE_KINDS = ("embedding", "position", "attention", "backend", "feedforward", "norm", "layer")


@dataclass(frozen=True)
class Check:
    """One property and the kinds it applies to.

    Attributes:
        name: short id (``eager_equivalence``).
        kinds: component kinds it is run for.
        run: the check.
        slow: compiles (``torch.compile``); marked so that it can be deselected.
    """

    name: str
    kinds: tuple[str, ...]
    run: Callable[[Subject], None]
    slow: bool = False


CHECKS: tuple[Check, ...] = (
    Check("shapes_dtypes", MODEL_KINDS, check_shapes_and_dtypes),
    Check("padding_mask", MODEL_KINDS, check_padding_mask),
    Check("batch_independence", MODEL_KINDS, check_batch_independence),
    Check("determinism", MODEL_KINDS, check_determinism),
    Check("gradients", MODEL_KINDS, check_gradients),
    Check("checkpoint_roundtrip", MODEL_KINDS, check_checkpoint_roundtrip),
    Check("cache_equivalence", CACHE_KINDS, check_cache_equivalence),
    Check("eager_equivalence", ("backend",), check_backend_eager_equivalence),
    Check("attention_weights", ("backend",), check_backend_attention_weights),
    Check("causal", ("backend",), check_backend_causal),
    Check("dropout", ("backend",), check_backend_dropout),
    Check("position_scheme", ("position",), check_position_scheme),
    Check("rotary_shift", ("position",), check_rotary_shift_invariance),
    Check("position_cache_chunks", ("position",), check_position_cache_chunks),
    Check("packed_positions", ("position",), check_packed_positions),
    Check("embedding", ("embedding",), check_embedding),
    Check("attention_module", ("attention",), check_attention_module),
    Check("position_wise", ("feedforward",), check_feedforward_position_wise),
    Check("elementwise", ("activation",), check_activation),
    Check("pooler", ("pooler",), check_pooler),
    Check("family_round_trip", ("family",), check_family_round_trip),
    Check("compile", MODEL_KINDS, check_compile, slow=True),
)


@dataclass(frozen=True)
class Case:
    """One check of one component: ``case.run()`` raises :class:`ConformanceError` if it fails."""

    subject: Subject
    check: Check

    @property
    def id(self) -> str:
        return f"{self.subject.kind}-{self.subject.name}-{self.check.name}"

    def run(self) -> None:
        """Run the check; under pytest a :class:`ConformanceSkip` becomes ``pytest.skip`` with its reason."""
        try:
            self.check.run(self.subject)
        except ConformanceSkip as skip:
            try:
                import pytest
            except ImportError:  # pragma: no cover - outside pytest the skip propagates
                raise skip from None
            pytest.skip(f"{self.id}: {skip}")


@dataclass
class ConformanceSuite:
    """Every applicable check for every registered component (or a selection).

    Args:
        registry: where the components come from (default: the process-wide registry).
        options: plugin options per ``(kind, name)`` for the tests; components not listed use their options
            model's defaults.
        checks: the checks to choose from (default: all of :data:`CHECKS`).
        compile_backend: the ``torch.compile`` backend of the compile check.
        configs: per ``(kind, name)``, the rest of the tiny config the component needs, merged over
            :data:`TINY_CONFIG` (nested keys merge): ``{("attention", "rotary"): {"position": "rope"}}``.
    """

    registry: Registry | None = None
    options: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    checks: tuple[Check, ...] = CHECKS
    compile_backend: str = "inductor"
    configs: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)

    def cases(
        self,
        kinds: Iterable[str] | None = None,
        names: Iterable[str] | None = None,
        provider: str | None = None,
        include: Iterable[str] | None = None,
        exclude: Iterable[str] = (),
    ) -> list[Case]:
        """The cases to run.

        Args:
            kinds: only components of these kinds.
            names: only components with these names.
            provider: only components whose provider (plugin name, with its distribution) contains this.
            include: only these check names; ``exclude``: not these.
        """
        reg = self.registry or get_registry()
        kinds = set(kinds) if kinds is not None else set(KINDS)
        names = set(names) if names is not None else None
        wanted = set(include) if include is not None else None
        out = []
        for component in reg.components():
            if component.kind not in kinds or (names is not None and component.name not in names):
                continue
            if provider is not None and provider not in component.provider:
                continue
            options = dict(self.options.get((component.kind, component.name), {}))
            base = dict(self.configs.get((component.kind, component.name), {}))
            subject = Subject(component, options, reg, self.compile_backend, base)
            for check in self.checks:
                if component.kind not in check.kinds or check.name in exclude:
                    continue
                if wanted is not None and check.name not in wanted:
                    continue
                out.append(Case(subject, check))
        return out

    def params(self, *args: Any, slow_marks: Iterable[Any] | None = None, **kwargs: Any) -> list[Any]:
        """:meth:`cases` as ``pytest.param`` s with readable ids; slow (compile) checks carry ``slow_marks``
        (default ``pytest.mark.compile``, which the project must register, or pass your own)."""
        import pytest

        marks = list(slow_marks) if slow_marks is not None else [pytest.mark.compile]
        return [
            pytest.param(case, id=case.id, marks=marks if case.check.slow else [])
            for case in self.cases(*args, **kwargs)
        ]

    def run(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        """Run the cases outside pytest; returns ``{case id: "ok" | "skipped: why" | "FAILED: what"}``."""
        report = {}
        for case in self.cases(*args, **kwargs):
            try:
                case.check.run(case.subject)
                report[case.id] = "ok"
            except ConformanceSkip as skip:
                report[case.id] = f"skipped: {skip}"
            except Exception as e:  # a crash is a failure too, reported with its type
                report[case.id] = f"FAILED: {type(e).__name__}: {e}"
        return report


__all__ = [
    "ATOL",
    "CHECKS",
    "TINY_CONFIG",
    "Case",
    "Check",
    "ConformanceError",
    "ConformanceSkip",
    "ConformanceSuite",
    "Subject",
]
