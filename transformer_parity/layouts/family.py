"""What a family is: one record per family module (`FAMILY`), naming every hook shared code asks of it.

A Hugging Face family (`hf_*.py`) exports an `HFFamily`, a KerasHub one (`kerashub_*.py`) a `KerasHubFamily`; the
registry (`layouts/__init__.py`: `hf_family(name)`, `kerashub_family(name)`) hands them out, and shared code
(`hf`, `hf_tasks`, `kerashub_preset`, `kerashub_classifiers`, `approximations`, `verify`'s sources) reads the record
and nothing else of the module. Every field is required: a hook a family lacks is stated as absent (`None`, `()`,
`{}`) in its own module, never left out, and whatever is particular to one family (sinusoid tables its library
builds in float32, a masked-LM task that predicts only its mask positions) is a field of its record rather than a
branch on its name elsewhere. Nothing here imports a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

if TYPE_CHECKING:  # annotations only: the records are built by the family modules, which import these themselves
    import reference_numpy as rn

    from .approximations import Approximation
    from .hf_tasks import Head
    from .kerashub_classifiers import Classifier

Table = list[tuple[str, str, str]]  # (canonical, external, transform) entries: `layouts.table`


@dataclass(frozen=True)
class Float64Fix:
    """Something transformers computes in float32 even in a float64 model, and how `verify`'s float64 run of it
    computes it exactly instead."""

    says: str  # verify's note: "<what>, which transformers builds in float32, replaced by the exact ones"
    apply: Callable[[Any, rn.TransformerConfig], None]  # (the float64 transformers model, config): in place


@dataclass(frozen=True)
class HFFamily:
    """One Hugging Face model type: how a model directory of it is recognised, read and written, and judged."""

    # how it is recognised
    name: str  # our format name (`--from` / `--to`), the registry's key
    model_type: str  # config.json's model_type
    architectures: tuple[str, ...]  # the classes it reads itself: (with an output projection, without one), or one
    # its config both ways
    config_from_hf: Callable[[Mapping[str, Any], Collection[str]], tuple[rn.TransformerConfig, str, list[str]]]
    export_problems: Callable[[rn.TransformerConfig], list[str]]  # why a config has no equivalent here ([]: one)
    config_to_hf: Callable[[rn.TransformerConfig], tuple[dict[str, Any], str]]  # (config.json, architecture)
    config_keys: Mapping[str, str]  # canonical field -> the config.json key it comes from, for messages
    # its weight table
    table: Callable[[rn.TransformerConfig, str], Table]  # (config, where the base model sits) -> entries
    prefix: Callable[..., str]  # (architecture, saved keys or None when writing) -> where the base model sits
    base_prefix: str  # where the class with a head keeps its base model ("" where the table names full keys)
    # the library classes that judge it (`verify.source_hf`)
    transformers_classes: tuple[str, str]  # transformers' class with an output projection, and without one
    hooks: Mapping[str, str]  # canonical sublayer pattern -> the module whose output it is, under the base model
    head_hook: str | None  # the module computing the head transform (dense -> activation -> norm); None: no head
    task_heads: tuple[Head, ...]  # its task classes (`hf_tasks`)
    # the settings it expresses, and the nearby ones it computes instead of others
    expresses: tuple[str, ...]  # the `layouts.FAMILY_ONLY` settings it has (and attention_scale: another scale)
    approximations: tuple[Approximation, ...]  # `layouts.approximations`
    # its quirks
    float64_fix: Float64Fix | None  # what transformers keeps in float32 in a float64 model of it; None: nothing


@dataclass(frozen=True)
class KerasHubFamily:
    """One KerasHub model (a backbone and its tasks), or a Keras model that has no preset: how its preset directory
    or bare `.weights.h5` is recognised, read and written, and judged."""

    # how it is recognised
    name: str  # our format name (`--from` / `--to`), the registry's key
    backbone: str | None  # the backbone class it writes; None: no KerasHub backbone, a bare .weights.h5 only
    backbones: tuple[str, ...]  # every backbone class read as this family (the written one first)
    tasks: tuple[str, ...]  # the task classes it reads and writes (the one written first)
    serialized: Mapping[str, tuple[str, str]]  # class -> (its Python module, its layer name), as config.json says
    # its config both ways
    config_from_kerashub: Callable[[dict[str, Any], str | None], tuple[rn.TransformerConfig, list[str]]] | None
    export_problems: Callable[[rn.TransformerConfig], list[str]]  # why a config has no equivalent here ([]: one)
    config_to_kerashub: Callable[[rn.TransformerConfig], tuple[dict[str, Any], str | None]] | None  # None: no preset
    task_config: Callable[[dict[str, Any], str], dict[str, Any]] | None  # a task's own task.json fields; None: none
    config_keys: Mapping[str, str]  # canonical field -> the config.json key it comes from, for messages
    fixed: Mapping[str, Any]  # the canonical settings every model of it has (what a bare .weights.h5 does not say)
    task_fields: Mapping[str, Mapping[str, Any]]  # task class -> the canonical fields it sets over the backbone's
    pad_token: str | None  # the backbone takes a padding mask: the vocabulary's pad token gives the pad id; None: no
    # its weight table
    layout: Path  # the layout file (`layouts.user`) of its backbone's table
    table: Callable[[rn.TransformerConfig], Table]  # the full table of a config (its task's weights included)
    settle_from_weights: Callable[[rn.TransformerConfig, Mapping[str, Any]],
                                  tuple[rn.TransformerConfig, list[str]]] | None  # what only the weights tell
    to_canonical_state: Callable[[rn.TransformerConfig, dict[str, Any]], None] | None  # arrays of another form
    from_canonical_state: Callable[[rn.TransformerConfig, dict[str, Any]], None] | None  # ... and back
    # the library classes that judge it (`verify.source_kerashub`), and its text classifier
    classifier: Classifier | None  # its text classifier (`kerashub_classifiers`); None: none
    predicts_mask_positions: tuple[str, ...]  # tasks whose head predicts only the `mask_positions` input's positions
    # the settings it expresses, and the nearby ones it computes instead of others
    expresses: tuple[str, ...]  # the `layouts.FAMILY_ONLY` settings it has
    approximations: tuple[Approximation, ...]  # `layouts.approximations`
