"""Fuzzing a family's ``config.json`` fields from its declaration (``Family.fields``): what the field fuzz test runs
on every registered family, built-in or third-party, with no code per family.

For each declared field, :func:`fuzz_family_fields` puts each of :data:`BAD_VALUES` (wrong types, ``"false"``,
``"1"``, negatives, huge numbers, ``null``) into the family's minimal ``config.json`` and translates and validates it
as a load does. A value the declaration refuses must be refused with a :class:`~bertblocks.config.ConfigError`
located at the field; a value it allows must translate, or be refused with a ``BertBlocksError``, never a raw
exception; a huge size it allows is measured on the meta device (refused by the size limit, never allocated). It
also translates the family's own written ``config.json`` back, with undeclared reads as errors (a
field the family reads without declaring would escape the fuzzing), and checks that a misspelt declared field is
warned about with its name ("did you mean").

Example:
    >>> problems = fuzz_family_fields("mybert", registry)
    >>> assert not problems, "\\n".join(problems)
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import BertBlocksError
from ..registry import Registry, get_registry, validate_config
from ..registry.builder import measure_allocation

__all__ = ["BAD_VALUES", "fuzz_family_fields"]

#: what every declared field is tried with
BAD_VALUES: tuple[Any, ...] = (
    "false",
    "true",
    "1",
    "",
    -1,
    0,
    1.5,
    float("inf"),
    10**9,
    10**7 + 1,
    10**30,
    True,
    False,
    None,
    [],
    ["x"],
    {},
    {"a": 1},
)

#: the values that, where the declaration allows them, are measured on the meta device too (no real allocation)
HUGE = (10**9, 10**7 + 1)


def fuzz_family_fields(model_type: str, registry: Registry | None = None) -> list[str]:
    """Try every declared field of the family ``model_type`` with :data:`BAD_VALUES`; return what went wrong.

    Returns:
        One line per problem (empty: the family holds to its declaration).
    """
    from ..config import ConfigError
    from ..families.fields import UndeclaredFieldWarning
    from ..hf.config_json import config_from_hf, config_to_hf
    from ..hf.families import get_family
    from ..hf.misspelt_keys import UnknownConfigKeyWarning

    reg = registry or get_registry()
    family = get_family(model_type, reg)
    base = {**family.example_config, "model_type": model_type}
    problems: list[str] = []

    def load(hf: Mapping[str, Any]) -> Any:
        return validate_config(config_from_hf(hf, reg), reg)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UndeclaredFieldWarning)
            config = load(base)
            load(config_to_hf(config, reg))  # the family's own fields, as it writes them
    except UndeclaredFieldWarning as e:
        return [f"{model_type}: {e}"]
    except Exception as e:
        return [f"{model_type}: its minimal config.json {base} does not load ({type(e).__name__}: {e})"]
    for name, declared in family.fields.items():
        for value in BAD_VALUES:
            hf = {**base, name: value}
            refused = declared.problem(value) is not None
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    config = load(hf)
                if not refused and value in HUGE:
                    measure_allocation(config, reg)  # a size the declaration allows is bounded by the model's
            except ConfigError as e:
                if refused and not any(issue.loc == name for issue in e.issues):
                    problems.append(f"{model_type}: {name}={value!r} refused without naming the field: {e}")
                continue
            except BertBlocksError as e:
                if refused:
                    problems.append(f"{model_type}: {name}={value!r} refused, but not by its declaration: {e}")
                continue
            except Exception as e:  # a raw exception: what the declaration is there to prevent
                problems.append(f"{model_type}: {name}={value!r} raised {type(e).__name__}: {e}")
                continue
            if refused:
                problems.append(f"{model_type}: {name}={value!r} accepted, but {declared.describe()} is declared")
        misspelt = name[:-2] + name[-1]  # one letter dropped
        if len(name) >= 10 and misspelt not in family.fields:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with contextlib.suppress(BertBlocksError):
                    load({**base, misspelt: family.example_config.get(name, 1)})
            if not any(
                issubclass(w.category, UnknownConfigKeyWarning) and "did you mean" in str(w.message) for w in caught
            ):
                problems.append(f"{model_type}: the misspelt key {misspelt!r} was not warned about (did you mean)")
    return problems
