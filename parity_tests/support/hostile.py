"""A small hand-written layout file (an encoder with `{i}` and `{qkv}` patterns) that the hostile-input tests and
`benchmarks/hostile_inputs.py` edit into hostile variants."""

LAYOUT = """\
[config]
num_heads = 2
activation = "relu"
norm_first = false
layer_norm_eps = 1e-5
scale_embedding = false
pad_id = 0
position_offset = 0
attention_scale = "head"

[weights]
"embed.weight" = "src_embed.embedding"
"pos.weight" = "src_pos.embedding"
"layers.{i}.attn.{qkv}.weight" = "encoder.layers.{i}.self_attn.{qkv}.kernel transpose"
"layers.{i}.attn.{qkv}.bias" = "encoder.layers.{i}.self_attn.{qkv}.bias"
"layers.{i}.attn.o.weight" = "encoder.layers.{i}.self_attn.o.kernel transpose"
"layers.{i}.attn.o.bias" = "encoder.layers.{i}.self_attn.o.bias"
"layers.{i}.norm1.weight" = "encoder.layers.{i}.norm1.gamma"
"layers.{i}.norm1.bias" = "encoder.layers.{i}.norm1.beta"
"layers.{i}.norm2.weight" = "encoder.layers.{i}.norm2.gamma"
"layers.{i}.norm2.bias" = "encoder.layers.{i}.norm2.beta"
"layers.{i}.ff1.weight" = "encoder.layers.{i}.ffn.linear1.kernel transpose"
"layers.{i}.ff1.bias" = "encoder.layers.{i}.ffn.linear1.bias"
"layers.{i}.ff2.weight" = "encoder.layers.{i}.ffn.linear2.kernel transpose"
"layers.{i}.ff2.bias" = "encoder.layers.{i}.ffn.linear2.bias"
"head.weight" = "output.kernel transpose"
"head.bias" = "output.bias"
"""
