"""KerasHub Qwen3-MoE (`Qwen3MoeBackbone`, `Qwen3MoeCausalLM`): Qwen3's attention (an RMSNorm on each head of q and k,
its own `head_dim`, `sliding_window_size` on every layer) with a mixture of experts as the feed-forward of the layers
transformers' rule picks (`decoder_sparse_step`, `mlp_only_layers`; the others dense, `intermediate_dim` wide).

The math, read from keras-hub 0.32 (`keras_hub/src/models/qwen3_moe/`): `Qwen3SparseMoeBlock`'s router (no bias)
takes the softmax over all `num_experts`, keeps the `top_k` best and, with `norm_top_k_prob`, divides them by their
sum; each expert is `silu(x gate) * (x up)` into its down projection, `moe_intermediate_dim` wide, its gate and up
kernels side by side in one array. Every expert runs on every token, weighed by the routing (zero off the chosen
ones): transformers' function. `Qwen3MoeTransformerDecoder` builds its attention without the model's epsilon, so the
q/k norms always normalize at that layer's default, 1e-6, while every other norm uses `layer_norm_epsilon`: a preset
at another epsilon reads as `qk_norm_eps=1e-6`, and a model whose q/k norms use another epsilon is refused (real
Qwen3-MoE checkpoints use 1e-6 everywhere). The head is untied by default. `router_aux_loss_coefficient` only
trains. The table is the layout file `kerashub_qwen3_moe.toml` beside this module plus the expert banks' per-expert
parts (`kerashub_experts`); the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_experts, kerashub_llama
from .family import KerasHubFamily
from .kerashub_experts import Bank, ExpertKeys
from .kerashub_llama import FamilySpec

NAME = "kerashub-qwen3-moe"
BACKBONE = "Qwen3MoeBackbone"
TASKS = ("Qwen3MoeCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_qwen3_moe.toml")
SERIALIZED = {"Qwen3MoeBackbone": ("keras_hub.src.models.qwen3_moe.qwen3_moe_backbone", "qwen3_moe_backbone"),
              "Qwen3MoeCausalLM": ("keras_hub.src.models.qwen3_moe.qwen3_moe_causal_lm", "qwen3_moe_causal_lm")}
CONFIG_KEYS = {**kerashub_llama.CONFIG_KEYS, "num_experts": "num_experts", "experts_per_token": "top_k",
               "expert_d_ff": "moe_intermediate_dim"}
FIXED = kerashub_llama.FIXED
TASK_FIELDS = {"Qwen3MoeCausalLM": kerashub_llama.CAUSAL_LM}
KEYS = ("vocabulary_size", "num_layers", "num_query_heads", "head_dim", "hidden_dim", "intermediate_dim",
        "moe_intermediate_dim", "rope_max_wavelength", "num_key_value_heads", "rope_scaling_factor",
        "layer_norm_epsilon", "dropout", "tie_word_embeddings", "sliding_window_size", "num_experts", "top_k",
        "norm_top_k_prob", "decoder_sparse_step", "mlp_only_layers",
        "router_aux_loss_coefficient")  # Qwen3MoeBackbone.get_config()
QK_NORM_EPS = 1e-6  # Qwen3MoeAttention's default, which Qwen3MoeTransformerDecoder never overrides
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.qwen3_moe", LAYOUT, qk_norm=True,
                  qk_norm_eps=QK_NORM_EPS, head_dim=True, window="sliding_window_size")
EXPERTS = ExpertKeys(width="moe_intermediate_dim", renormalize="norm_top_k_prob", shared=None, layer_rule="by_index",
                     training=("router_aux_loss_coefficient",), backbone=BACKBONE)
_BANK = "layers/qwen3_moe_transformer_decoder_{i}/mlp/expert_bank/vars/"
_E = "decoder.layers.{i}.ffn.experts.{e}."
BANKS = (Bank(_BANK + "0", (_E + "gate.kernel", _E + "linear1.kernel")),  # (experts, hidden, 2 x moe_intermediate)
         Bank(_BANK + "1", (_E + "linear2.kernel",)))  # (experts, moe_intermediate, hidden)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    **kerashub_experts.functions(kerashub_llama.functions(SPEC), EXPERTS, BANKS, KEYS),  # Llama's hooks + the experts
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, classifier=None, predicts_mask_positions=(), expresses=("num_experts", "qk_norm_eps"),
    approximations=())
