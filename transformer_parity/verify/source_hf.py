"""The built-in source for a Hugging Face directory: transformers' own class (the task class the directory names, or
the family's), run in float32 as it ships and in float64 made exact (`exact_float64`), its sublayers hooked under
canonical names (the family record's `hooks`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import reference_numpy as rn

from transformer_parity.errors import UsageError
from transformer_parity.layouts import hf_family, hf_tasks
from .source_contract import OUTPUT, Batch, Source, SourceRun, _expand, _hook_outputs


def _hf_source(path: Path, fmt: str, config: rn.TransformerConfig) -> Source:
    """transformers' own model class on the directory, in float32 and float64. Its attention mask marks the probe's
    padding, as a tokenizer's would: the probe pads with the port's pad id only (none when the port has no pad token:
    a family that derives no padding from ids reads none even when config.json names a pad_token_id)."""
    from transformer_parity.layouts import hf_dir

    hf_dir.read_config(path)  # the directory's config.json is checked as the port read it
    family = hf_family(fmt)
    head = hf_tasks.head_for(family, config)  # a task class (a sequence classifier, ...), else the family's own
    cls_name = head.arch if head is not None else family.transformers_classes[0 if config.output_projection else 1]
    pad = config.pad_id
    notes = [f"transformers {cls_name}: attention mask " + (f"0 where the probe pads (pad id {pad})"
                                                            if pad is not None else "all ones (no pad token)")]
    if config.num_experts:
        notes.append(f"transformers {cls_name}: its experts run by its eager implementation (one expert at a time)")
    state: dict[str, Any] = {}

    def model32():
        if "model" not in state:
            import torch
            import transformers

            from transformers.utils import logging as hf_logging

            cls = getattr(transformers, cls_name)
            verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
            hf_logging.set_verbosity_error()  # its load report: the keys are checked below
            hf_logging.disable_progress_bar()  # its "Loading weights" bar: the verdict says what was loaded
            try:
                model, info = cls.from_pretrained(str(path), output_loading_info=True, dtype=torch.float32)
            finally:
                hf_logging.set_verbosity(verbosity)
                if bars:
                    hf_logging.enable_progress_bar()
            missing = [k for k in info.get("missing_keys", ()) if not (k.startswith("pooler.") and not config.pooler)]
            if missing or info.get("mismatched_keys"):
                raise UsageError(f"transformers cannot load {path} as {cls_name}: missing "
                                 f"{missing[:4] or 'nothing'}, mismatched {list(info.get('mismatched_keys', ()))[:4]}"
                                 "; pass --no-source to verify without it")
            if config.num_experts:  # its default, grouped_mm, takes no float64 and no odd widths
                model.set_experts_implementation("eager")
            state["model"] = model.eval()
        return state["model"]

    def run(batch: Batch) -> list[SourceRun]:
        model = model32()
        model64 = copy.deepcopy(model).double()
        if family.float64_fix is not None:  # what transformers keeps in float32 even in a float64 model of it
            family.float64_fix.apply(model64, config)
        if config.positional == "rope" or config.norm == "rms":
            exact_float64(model64, config)
        return [SourceRun("transformers-f32", _hf_forward(model, family, config, batch, pad)),
                SourceRun("transformers-f64", _hf_forward(model64, family, config, batch, pad))]

    if family.float64_fix is not None:
        notes.append(f"transformers-f64: {family.float64_fix.says}")
    if config.positional == "rope" or config.norm == "rms":
        notes.append("transformers-f64: the rotary angles and RMSNorms (and a float32 embedding scale, a router's "
                     "softmax), which transformers computes in float32 even in a float64 model, computed in float64; "
                     "the float32 run is transformers as it ships")
    return Source(f"transformers {cls_name}", "builtin", run, notes)


def exact_float64(model64, config: rn.TransformerConfig) -> None:
    """Make a float64 transformers model float64 throughout: its rotary embedding computes the angles in float32
    from float32 frequencies, its RMSNorms upcast to float32 only, an embedding scale may be a float32 constant, and
    a mixture of experts' router takes its softmax in float32, so the 'float64' model is float32 there. Each is
    replaced by the same formula in float64 (the frequencies by the reference's, `ops.rope_frequencies`, which the
    float32 run checks against transformers' own; the router by `torch_impl.moe.route`, which picks the experts
    with the same `torch.topk`)."""
    import types

    import torch

    def rotary(self, x, position_ids, layer_type=None):
        inv_freq, scaling = rn.ops.rope_frequencies(config, int(position_ids.max()) + 1)
        freqs = position_ids[..., None].double() * torch.as_tensor(inv_freq)  # (B, T, r/2)
        if config.rotary_interleaved:  # adjacent dims turn together: each pair's angle twice (B, T, r)
            angles = torch.repeat_interleave(freqs, 2, dim=-1)
        else:  # the two halves' angles (B, T, r)
            angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * scaling).to(x.dtype), (angles.sin() * scaling).to(x.dtype)

    def rms(self, x):
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
        scale = self.weight + config.norm_weight_offset if config.norm_weight_offset else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale

    def router(self, x):  # (scores, weights, chosen experts), as transformers' routers return them
        from torch_impl.moe import route

        logits = torch.nn.functional.linear(x.reshape(-1, self.weight.shape[-1]), self.weight,
                                            getattr(self, "bias", None))  # a router's bias, where it has one
        ids, weights = route(logits, config)
        return logits, weights, ids

    for module in model64.modules():
        kind = type(module).__name__
        if kind.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(rotary, module)
        elif kind.endswith("RMSNorm"):
            module.forward = types.MethodType(rms, module)
        elif kind.endswith("TopKRouter"):
            module.forward = types.MethodType(router, module)
        elif isinstance(getattr(module, "embed_scale", None), torch.Tensor):
            module.embed_scale = torch.tensor(float(module.scalar_embed_scale), dtype=torch.float64)


def _hf_forward(model, family, config: rn.TransformerConfig, batch: Batch, pad: int | None) -> dict[str, Any]:
    """The outputs of transformers' `model` on `batch`, and its sublayers' under canonical names (`family`: its
    record's `hooks` and `head_hook`)."""
    import torch

    def mask(ids):
        return None if pad is None else torch.as_tensor(ids != pad).long()

    src = torch.as_tensor(batch["src_ids"])
    kwargs: dict[str, Any] = {"input_ids": src, "attention_mask": mask(batch["src_ids"]), "output_hidden_states": True}
    if "src_type_ids" in batch:
        kwargs["token_type_ids"] = torch.as_tensor(batch["src_type_ids"])
    if "tgt_ids" in batch:
        kwargs.update(decoder_input_ids=torch.as_tensor(batch["tgt_ids"]),
                      decoder_attention_mask=mask(batch["tgt_ids"]))
    if config.classifier == "choice":  # a multiple-choice class takes (batch, choices, length): each row one choice
        kwargs.update({k: v[:, None] for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    if config.choice_head:  # a double-heads model: the score read where ours reads it, the last real position
        real = src != pad if pad is not None else torch.ones_like(src, dtype=torch.bool)
        kwargs["mc_token_ids"] = (torch.arange(src.shape[1]) * real.long()).argmax(-1)
    base = model.base_model
    layers = {"encoder": config.num_encoder_layers, "decoder": config.num_decoder_layers}
    wanted = {name: module for name, module in _expand(family.hooks, layers).items()  # a dense layer routes nothing
              if not name.endswith(".routing") or config.layer_experts(int(name.split(".")[2]))}
    if not config.final_norm:
        wanted.pop("decoder.final_norm", None)
    modules = {name: base.get_submodule(module) for name, module in wanted.items()}
    # the head's dense -> activation -> norm (a pooled classifier's may run on the pooled vector alone)
    if family.head_hook is not None and config.head_transform and not config.pooled_classifier:
        modules["head"] = model.get_submodule(family.head_hook)
    if config.pooler and hf_tasks.has_head(config):  # a task class returns no pooler_output: its pooler is hooked
        modules["pooler"] = getattr(base, "pooler_activation", None) or base.pooler  # a tanh of its own, or none
    record: dict[str, Any] = {}
    handles = _hook_outputs(modules, record)
    try:
        with torch.no_grad():
            out = model(**kwargs)
    finally:
        for handle in handles:
            handle.remove()
    for name in [n for n in record if n.endswith(".routing")]:  # each token's chosen experts, ascending, (B, T, k)
        record[name] = record[name].sort(dim=-1).values.reshape(*src.shape, -1).to(out.hidden_states[0].dtype)
    if config.is_decoder_only:
        record["decoder.embed"] = out.hidden_states[0]  # the last has ln_f applied: the layers are hooked instead
    elif config.is_encoder_only:
        record["encoder.embed"] = out.hidden_states[0]
    else:
        record["encoder.embed"] = out.encoder_hidden_states[0]
        record["decoder.embed"] = out.decoder_hidden_states[0]
    if config.pooler and getattr(out, "pooler_output", None) is not None:
        record["pooler"] = out.pooler_output
    if config.classifier == "span":  # question answering: start and end scores, stacked as the canonical head's
        final = torch.stack([out.start_logits, out.end_logits], dim=-1)
    elif config.next_sentence:  # a pretraining class; a next-sentence class beside its hidden states
        pair = getattr(out, "seq_relationship_logits", None)
        final, record["next_sentence"] = ((out.prediction_logits, out.sop_logits if pair is None else pair)
                                          if config.output_projection else (out.hidden_states[-1], out.logits))
    elif config.classifier == "choice":  # (batch, choices) scores: our rows are the choices, one score each
        final = out.logits.reshape(-1, 1)
    elif config.choice_head:  # its (batch,) multiple-choice scores beside the LM logits
        final, record["choice"] = out.logits, out.mc_logits.reshape(-1, 1)
    else:
        final = out.logits if config.output_projection or config.classifier else out.last_hidden_state
    return {OUTPUT: final, **record}
