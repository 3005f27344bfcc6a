"""KerasHub Mixtral (`MixtralBackbone`, `MixtralCausalLM`): Mistral's attention, norms and window (`sliding_window`
on every layer; none when null), with a mixture of experts as every layer's feed-forward.

The math, read from keras-hub 0.32 (`keras_hub/src/models/mixtral/`): `MixtralSparseMoeBlock`'s router
(`_sparse_feedforward_gate_dense`, no bias) takes the softmax over all `num_experts`, keeps the `top_k` best and
divides them by their sum (canonical `router_softmax="before_topk"`, `router_renormalize=True`); each expert is
`silu(x gate) * (x up)` into its down projection, `intermediate_dim` wide, no biases. keras_hub runs every expert on
every token and weighs the outputs by the routing (zero off the chosen ones): the same function as transformers'.
The head is never tied (`MixtralCausalLM`'s reverse embedding, `tie_weights=False`). `router_jitter_noise` and
`router_aux_loss_coef` only train. The table is the layout file `kerashub_mixtral.toml` beside this module plus the
expert bank's per-expert parts (`kerashub_experts`); the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_experts, kerashub_llama
from .family import KerasHubFamily
from .kerashub_experts import Bank, ExpertKeys
from .kerashub_llama import FamilySpec

NAME = "kerashub-mixtral"
BACKBONE = "MixtralBackbone"
TASKS = ("MixtralCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_mixtral.toml")
SERIALIZED = {"MixtralBackbone": ("keras_hub.src.models.mixtral.mixtral_backbone", "mixtral_backbone"),
              "MixtralCausalLM": ("keras_hub.src.models.mixtral.mixtral_causal_lm", "mixtral_causal_lm")}
CONFIG_KEYS = {**kerashub_llama.CONFIG_KEYS, "num_experts": "num_experts", "experts_per_token": "top_k"}
FIXED = kerashub_llama.FIXED
TASK_FIELDS = {"MixtralCausalLM": kerashub_llama.CAUSAL_LM}
KEYS = ("vocabulary_size", "num_layers", "num_query_heads", "hidden_dim", "intermediate_dim", "num_experts", "top_k",
        "router_jitter_noise", "rope_max_wavelength", "rope_scaling_factor", "num_key_value_heads",
        "router_aux_loss_coef", "sliding_window", "layer_norm_epsilon", "dropout")  # MixtralBackbone.get_config()
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.mixtral", LAYOUT, window="sliding_window",
                  can_tie=False)
EXPERTS = ExpertKeys(width=None, renormalize=None, shared=None, layer_rule="every_layer",
                     training=("router_jitter_noise", "router_aux_loss_coef"), backbone=BACKBONE)
_BANK = "layers/mixtral_transformer_decoder_{i}/_sparse_moe_block/expert_bank/vars/"
_E = "decoder.layers.{i}.ffn.experts.{e}."
BANKS = (Bank(_BANK + "0", (_E + "gate.kernel",)),  # (experts, hidden, intermediate)
         Bank(_BANK + "1", (_E + "linear1.kernel",)),  # the up projections, likewise
         Bank(_BANK + "2", (_E + "linear2.kernel",)))  # (experts, intermediate, hidden)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    **kerashub_experts.functions(kerashub_llama.functions(SPEC), EXPERTS, BANKS, KEYS),  # Llama's hooks + the experts
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, classifier=None, predicts_mask_positions=(), expresses=("num_experts",), approximations=())
