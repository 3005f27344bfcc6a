"""The built-in source for a KerasHub preset: keras_hub's own class (the task of task.json, else the backbone), in
float32, its layers' outputs recorded under canonical names."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

import reference_numpy as rn

from .source_contract import OUTPUT, Batch, Source, SourceRun


def _kerashub_source(path: Path, fmt: str, config: rn.TransformerConfig) -> Source:
    """keras_hub's own class (the task of task.json, else the backbone) from the preset of the family `fmt`, in
    float32; its padding mask is an input, given as ids != the config's pad_id (all ones without a pad id)."""
    import json

    from transformer_parity.layouts import kerashub_family

    task_file, config_file = path / "task.json", path / "config.json"
    cls_name = json.loads((task_file if task_file.is_file() else config_file).read_text()).get("class_name")
    masked = cls_name in kerashub_family(fmt).predicts_mask_positions
    pad = config.pad_id
    notes = [f"keras_hub {cls_name}: run in float32 only (its float64 forward computes a few constants in float32, "
             "docs/kerashub.md); padding_mask " + (f"ids != pad_id={pad}" if pad is not None else "all ones")]

    def run(batch: Batch) -> list[SourceRun]:
        import tf_impl.startup  # noqa: F401 (TensorFlow's start-up notices kept off the terminal)
        import keras_hub

        model = getattr(keras_hub.models, cls_name).from_preset(str(path))
        ids = batch["src_ids"]

        def padding(x):
            return x != pad if pad is not None else np.ones(x.shape, bool)

        inputs = {"token_ids": ids, "padding_mask": padding(ids)}
        if "tgt_ids" in batch:  # an encoder-decoder
            inputs = {"encoder_token_ids": ids, "encoder_padding_mask": padding(ids),
                      "decoder_token_ids": batch["tgt_ids"], "decoder_padding_mask": padding(batch["tgt_ids"])}
        if "src_type_ids" in batch:
            inputs["segment_ids"] = batch["src_type_ids"]
        if masked:  # its head predicts mask_positions only: every position, as the canonical head
            inputs["mask_positions"] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
        layers = _kerashub_layers(model, config)
        out = model(inputs)
        if cls_name.endswith("Backbone") and config.output_projection and hasattr(model, "token_embedding"):
            out = model.token_embedding(out, reverse=True)  # a backbone saved alone with its untied head
        if layers:
            import keras

            backbone = getattr(model, "backbone", model)
            probe = keras.Model(backbone.inputs, {name: layer.output for name, layer in layers.items()})
            values = probe({k: v for k, v in inputs.items() if k in ("token_ids", "padding_mask")})
            return [SourceRun("keras_hub-f32", {OUTPUT: np.asarray(out),
                                                **{k: np.asarray(v) for k, v in values.items()}})]
        if isinstance(out, Mapping):  # a backbone with several outputs (a pooled one, an encoder's)
            raw = {OUTPUT: np.asarray(out["decoder_sequence_output" if "tgt_ids" in batch else "sequence_output"])}
            if config.pooler:
                raw["pooler"] = np.asarray(out["pooled_output"])
        else:
            raw = {OUTPUT: np.asarray(out)}
        return [SourceRun("keras_hub-f32", raw)]

    return Source(f"keras_hub {cls_name}", "builtin", run, notes)


# the attributes keras_hub's backbones keep their final norm in (most use `layer_norm`), the first one it has
FINAL_NORMS = ("layer_norm", "norm", "final_layernorm")


def _kerashub_layers(model, config: rn.TransformerConfig) -> dict[str, Any]:
    """Canonical name -> the KerasHub layer whose output it is, for a decoder-only backbone with `transformer_layers`
    (each decoder layer, and the final norm): what names the first layer where keras_hub and another library part."""
    backbone = getattr(model, "backbone", model)
    stack = getattr(backbone, "transformer_layers", None)
    if not config.is_decoder_only or not stack or len(stack) != config.num_decoder_layers:
        return {}
    layers = {f"decoder.layers.{i}": layer for i, layer in enumerate(stack)}
    final = next((getattr(backbone, name) for name in FINAL_NORMS if getattr(backbone, name, None) is not None), None)
    if config.final_norm and final is not None:
        layers["decoder.final_norm"] = final
    return layers
