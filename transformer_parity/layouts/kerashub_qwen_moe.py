"""KerasHub Qwen-MoE (Qwen2-MoE; `QwenMoeBackbone`, `QwenMoeCausalLM`): Qwen's attention (biases on q, k and v, a
sliding window on every layer when `use_sliding_window_attention` says so), with a mixture of experts and a
sigmoid-gated shared expert as every layer's feed-forward.

The math, read from keras-hub 0.32 (`keras_hub/src/models/qwen_moe/`): `QwenSparseMoeBlock`'s router (no bias) takes
the softmax over all `num_experts`, keeps the `top_k` best and, with `norm_top_k_prob`, divides them by their sum;
each expert is `silu(x gate) * (x up)` into its down projection, `moe_intermediate_dim` wide, its gate and up kernels
side by side in one array; the shared expert (`shared_expert_intermediate_dim` wide) is added times
`sigmoid(x shared_expert_gate)`. Every expert runs on every token, weighed by the routing: transformers' function.

Which layers have experts: `QwenMoeBackbone` never passes `layer_index` to its decoder layers, so each applies
transformers' rule (`decoder_sparse_step`, `mlp_only_layers`) to index 0: every layer has experts, or none. A preset
whose rule gives none (0 in `mlp_only_layers`, or a step above 1) is refused (a dense model); one that lists other
layers as dense is read as keras_hub computes it (every layer with experts), with a note; a model with dense layers
among its expert layers has no equivalent here. `output_router_logits` and `router_aux_loss_coefficient` only train.
The table is the layout file `kerashub_qwen_moe.toml` beside this module plus the expert banks' per-expert parts
(`kerashub_experts`); the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_experts, kerashub_llama
from .family import KerasHubFamily
from .kerashub_experts import Bank, ExpertKeys
from .kerashub_llama import FamilySpec

NAME = "kerashub-qwen-moe"
BACKBONE = "QwenMoeBackbone"
TASKS = ("QwenMoeCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_qwen_moe.toml")
SERIALIZED = {"QwenMoeBackbone": ("keras_hub.src.models.qwen_moe.qwen_moe_backbone", "qwen_moe_backbone"),
              "QwenMoeCausalLM": ("keras_hub.src.models.qwen_moe.qwen_moe_causal_lm", "qwen_moe_causal_lm")}
CONFIG_KEYS = {**kerashub_llama.CONFIG_KEYS, "num_experts": "num_experts", "experts_per_token": "top_k",
               "expert_d_ff": "moe_intermediate_dim", "shared_expert_d_ff": "shared_expert_intermediate_dim"}
FIXED = kerashub_llama.FIXED
TASK_FIELDS = {"QwenMoeCausalLM": kerashub_llama.CAUSAL_LM}
KEYS = ("vocabulary_size", "num_layers", "num_query_heads", "hidden_dim", "intermediate_dim", "moe_intermediate_dim",
        "shared_expert_intermediate_dim", "rope_max_wavelength", "num_key_value_heads", "rope_scaling_factor",
        "layer_norm_epsilon", "dropout", "tie_word_embeddings", "use_sliding_window_attention", "sliding_window_size",
        "num_experts", "top_k", "norm_top_k_prob", "decoder_sparse_step", "mlp_only_layers", "output_router_logits",
        "router_aux_loss_coefficient")  # QwenMoeBackbone.get_config() (and the training coefficient it takes)
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.qwen_moe", LAYOUT, qkv_bias=True,
                  window="sliding_window_size", window_flag="use_sliding_window_attention")
EXPERTS = ExpertKeys(width="moe_intermediate_dim", renormalize="norm_top_k_prob",
                     shared="shared_expert_intermediate_dim", layer_rule="as_layer_0",
                     training=("output_router_logits", "router_aux_loss_coefficient"), backbone=BACKBONE)
_BANK = "layers/qwen_moe_transformer_decoder_{i}/mlp/expert_bank/vars/"
_E = "decoder.layers.{i}.ffn.experts.{e}."
BANKS = (Bank(_BANK + "0", (_E + "gate.kernel", _E + "linear1.kernel")),  # (experts, hidden, 2 x moe_intermediate)
         Bank(_BANK + "1", (_E + "linear2.kernel",)))  # (experts, moe_intermediate, hidden)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    **kerashub_experts.functions(kerashub_llama.functions(SPEC), EXPERTS, BANKS, KEYS),  # Llama's hooks + the experts
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, classifier=None, predicts_mask_positions=(), expresses=("num_experts",), approximations=())
