"""Components chosen by name: the spec of each kind, its typed shared fields, and the schema's defaults.

A component is chosen by name (``{name: NAME}``, or the shorthand ``NAME``), never by import path, so a
YAML file someone sends you cannot import arbitrary code. The fields every component of a kind shares
(``num_heads`` for attention, ``intermediate_size`` for feed-forward, …) are typed here; any further keys
are the plugin's own options, validated by the options model the plugin declares (see
:func:`bertblocks.registry.validate_config`), so a third-party option gets the same errors as a built-in.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    Strict,
    model_serializer,
    model_validator,
)

# Strict scalars: a config means one thing. `true` is no layer count and "0.1" no rate, in YAML and in a
# config.json alike (pydantic's lax mode would read them as 1 and 0.1); a float field still takes an int.
#: a count or size, at least 1
Count = Annotated[int, Strict(), Field(gt=0)]
#: an int, at least 0
NonNegativeCount = Annotated[int, Strict(), Field(ge=0)]
#: a real number (an int is taken, a bool or a string is not)
Real = Annotated[float, Strict()]
#: a rate between 0 and 1
Probability = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]
#: ``true`` or ``false``, nothing else (not 0/1, not "yes")
Flag = Annotated[bool, Strict()]


# -------------------------------------------------------------------------------------------- components
class ComponentSpec(BaseModel):
    """A component chosen by name; keys other than the typed fields are the plugin's own options."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    name: str
    #: the plugin's option defaults, recorded when the registry fills them in (``validate``), so that
    #: diagrams (:mod:`bertblocks.introspect`) show only options that differ from them
    _option_defaults: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        # equal specs name the same component with the same values, whether or not the registry has told
        # them their defaults yet (pydantic would compare that private record too)
        if not isinstance(other, ComponentSpec):
            return NotImplemented
        return (
            type(self) is type(other)
            and self.__dict__ == other.__dict__
            and self.__pydantic_extra__ == other.__pydantic_extra__
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like every pydantic model

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `backend: eager` is short for `backend: {name: eager}`.
        return {"name": data} if isinstance(data, str) else data

    def options(self) -> dict[str, Any]:
        """The plugin-specific options (everything that is not a typed field of this spec)."""
        return dict(self.__pydantic_extra__ or {})

    def changed_options(self) -> dict[str, Any]:
        """The plugin options that differ from the plugin's defaults (all of them before ``validate`` has
        recorded the defaults)."""
        defaults = self._option_defaults
        return {k: v for k, v in self.options().items() if k not in defaults or defaults[k] != v}


#: The component of each kind a config gets when it names none: BERT's. These are the only component names
#: the schema knows (the registry checks that they exist; ``bertblocks components`` lists the others), and
#: ``tests/test_layering.py`` checks that no other built-in component name appears in ``core/``.
DEFAULT_COMPONENTS: dict[str, str] = {
    "embedding": "bert",
    "position": "absolute",
    "attention": "bert",
    "backend": "sdpa",
    "feedforward": "bert",
    "activation": "gelu",
    "norm": "layernorm",
    "layer": "post_ln",
    "pooler": "first_token",
    "family": "bert",
}


class EmbeddingSpec(ComponentSpec):
    """Embedding component (``bertblocks components embedding`` lists them)."""

    name: str = DEFAULT_COMPONENTS["embedding"]


class PositionSpec(ComponentSpec):
    """Position scheme (``bertblocks components position`` lists them)."""

    name: str = DEFAULT_COMPONENTS["position"]


class BackendSpec(ComponentSpec):
    """Attention kernel (``bertblocks components backend`` lists them); chosen once, at build time."""

    name: str = DEFAULT_COMPONENTS["backend"]


class AttentionSpec(ComponentSpec):
    """Multi-head attention (``bertblocks components attention`` lists them)."""

    name: str = DEFAULT_COMPONENTS["attention"]
    num_heads: Count = Field(12, description="attention heads; must divide hidden_size")
    dropout: Probability = Field(
        0.1, description="dropout on attention probabilities (HF attention_probs_dropout_prob)"
    )
    backend: BackendSpec = Field(default_factory=BackendSpec, description="attention kernel, chosen at build time")


class FeedForwardSpec(ComponentSpec):
    """Position-wise feed-forward block (``bertblocks components feedforward`` lists them)."""

    name: str = DEFAULT_COMPONENTS["feedforward"]
    intermediate_size: Count = Field(3072, description="inner width (HF intermediate_size)")
    activation: str = Field(
        DEFAULT_COMPONENTS["activation"],
        description="activation by name (HF hidden_act); the default gelu is the exact erf form. A gated "
        "feed-forward applies it to its gate; the activations geglu, swiglu and reglu name that gate for it",
    )


class NormSpec(ComponentSpec):
    """Normalisation inside the layers and after the stack (``bertblocks components norm`` lists them).

    The epsilon is the config's ``layer_norm_eps``.
    """

    name: str = DEFAULT_COMPONENTS["norm"]


class LayerSpec(ComponentSpec):
    """How a layer composes its sub-layers, norms and residuals (``bertblocks components layer`` lists them)."""

    name: str = DEFAULT_COMPONENTS["layer"]
    final_norm: Flag | None = Field(
        None,
        description="a norm after the last layer; null = the layer kind's default (pre-LN and parallel kinds: "
        "yes, BERT's post-LN: no, and true is an error there: its layers already end with a norm)",
    )


class HeadSpec(ComponentSpec):
    """Task head (``bertblocks components head`` lists them)."""

    name: str


class PoolerSpec(ComponentSpec):
    """Pooler (``bertblocks components pooler`` lists them)."""

    name: str = DEFAULT_COMPONENTS["pooler"]
    always: Flag = Field(
        False,
        description="a task model keeps the pooler whatever its head reads (transformers' LayoutLMFor… classes "
        "build their backbone with it, so every checkpoint holds it); false: only for heads that read the pooled "
        "output, as transformers' BERT",
    )

    @model_serializer(mode="wrap")
    def _flag_only_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # false is what an absent flag means: left out, so that a pooler saved in a config.json's bertblocks block
        # (a family without one) or a YAML dump reads {name: first_token}, not a default spelled out
        data = handler(self)
        if not self.always:
            data.pop("always", None)
        return data
