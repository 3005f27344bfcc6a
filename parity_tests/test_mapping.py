"""The one mapping language (`reference_numpy.mapping`): every transform is invertible, fused q/k/v split and join
for equal and grouped-query widths, and every table in the project (the twins', the formats', the families') is
written in it and round-trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_numpy as rn
from reference_numpy import mapping

RESHAPING = ("identity", "transpose", "heads_out", "heads_in", "heads_first", "row", "seq_first")


@settings(max_examples=60, deadline=None)
@given(transform=st.sampled_from(RESHAPING), heads=st.integers(1, 4), head_dim=st.integers(1, 5),
       other=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_every_transform_round_trips(transform, heads, head_dim, other, seed):
    shape = (other, heads * head_dim) if transform != "heads_in" else (heads * head_dim, other)
    array = np.random.default_rng(seed).standard_normal(shape)
    external = mapping.to_external(array, transform, head_dim)
    assert external.shape == mapping.external_shape(transform, shape, head_dim)
    assert mapping.canonical_shape(transform, external.shape) == shape
    back = mapping.to_canonical(external, transform, shape)
    np.testing.assert_array_equal(back, array)
    assert not np.shares_memory(back, array) and not np.shares_memory(external, array)


def test_heads_first_puts_the_heads_before_the_input_features():
    """KerasHub Gemma's q/k/v kernels `(H, in, dk)`: entry [h, i, d] is canonical [i, h * dk + d], the `heads_out`
    array with its first two axes swapped; a bias `(H * dk,)` is `(H, dk)`, as under `heads_out`."""
    rng = np.random.default_rng(3)
    kernel, bias = rng.standard_normal((5, 3 * 4)), rng.standard_normal(3 * 4)
    external = mapping.to_external(kernel, "heads_first", head_dim=4)
    assert external.shape == (3, 5, 4) and external.flags.c_contiguous
    assert external[2, 1, 3] == kernel[1, 2 * 4 + 3]
    np.testing.assert_array_equal(external, mapping.to_external(kernel, "heads_out", 4).transpose(1, 0, 2))
    np.testing.assert_array_equal(mapping.to_external(bias, "heads_first", 4), bias.reshape(3, 4))
    assert mapping.canonical_shape("heads_first", (3, 5, 4)) == (5, 12)
    assert mapping.canonical_shape("heads_first", (12,)) is None
    np.testing.assert_array_equal(mapping.to_canonical(external, "heads_first", (5, 12)), kernel)


FUSED_CASES = [(t, (8, 8, 8) if "blocks" in t else (6, 6, 6)) for t in mapping.FUSED] + [
    (t, (6, 2, 2)) for t in mapping.FUSED if "heads" not in t and "blocks" not in t] + [
    (t, (12, 4, 4)) for t in mapping.FUSED if "groups" in t]


@pytest.mark.parametrize("transform,widths", FUSED_CASES, ids=[f"{t}-{w}" for t, w in FUSED_CASES])
def test_fused_qkv_split_and_join(transform, widths):  # grouped-query k/v are narrower; per-head interleaving is not
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((5, w)) for w in widths]  # canonical (in, out) kernels
    fused = mapping.fuse(parts, transform, head_dim=2)
    assert fused.shape == mapping.external_shape(transform, (5, widths[0]), 2, [p.shape for p in parts])
    for part, expected in enumerate(parts):
        np.testing.assert_array_equal(mapping.fused_part(fused, transform, part, widths, head_dim=2), expected)
    if transform == "fused_qkv_t":  # nn.Linear's (q+k+v, in): q's rows first
        np.testing.assert_array_equal(fused[:widths[0]], parts[0].T)
    if transform == "fused_qvk_blocks_t":  # each block: a quarter of q's heads, then v's, then k's
        np.testing.assert_array_equal(fused[2:4], parts[2][:, :2].T)
        np.testing.assert_array_equal(fused[4:6], parts[1][:, :2].T)
        np.testing.assert_array_equal(fused[6:8], parts[0][:, 2:4].T)


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (6, 1), (6, 6)])
def test_fused_qkv_groups_is_falcons_split(heads, kv_heads):
    """Falcon's `_split_heads` on an output `(G, g + 2, dk)`: the first g = H / G of each group are query heads, then
    its key, then its value (new_decoder_architecture's groups; multi-query is one group, neither G = H)."""
    dk, per = 2, heads // kv_heads
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal((5, n * dk)) for n in (heads, kv_heads, kv_heads)]
    fused = mapping.fuse(parts, "fused_qkv_groups_t", head_dim=dk)  # (out, in), as nn.Linear holds it
    view = fused.T.reshape(5, kv_heads, per + 2, dk)
    np.testing.assert_array_equal(view[:, :, :-2].reshape(5, -1), parts[0])
    np.testing.assert_array_equal(view[:, :, -2].reshape(5, -1), parts[1])
    np.testing.assert_array_equal(view[:, :, -1].reshape(5, -1), parts[2])
    if kv_heads == heads:  # one group per head: the per-head interleaving
        np.testing.assert_array_equal(fused, mapping.fuse(parts, "fused_qkv_heads_t", head_dim=dk))
    if kv_heads == 1:  # multi-query: q | k | v side by side
        np.testing.assert_array_equal(fused, mapping.fuse(parts, "fused_qkv_t", head_dim=dk))


def test_a_fused_array_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="its parts need 6\\+2\\+2"):
        mapping.fused_part(np.zeros((5, 12)), "fused_qkv", 0, (6, 2, 2))


def test_a_table_entry_is_checked():
    with pytest.raises(ValueError, match="unknown transform 'flip'"):
        mapping.check_table([("a", "b", "flip")])
    with pytest.raises(ValueError, match="needs \\{qkv\\}"):
        mapping.check_table([("encoder.layers.{i}.self_attn.q.kernel", "x", "fused_qkv")])
    with pytest.raises(ValueError, match="'\\{x\\}' is not a placeholder"):
        mapping.parse_pattern("layers.{x}.weight")


def test_two_canonical_names_for_one_external_need_shared():
    table = [("src_pos.embedding", "pos", "identity"), ("tgt_pos.embedding", "pos", "identity")]
    names = ["src_pos.embedding", "tgt_pos.embedding"]
    with pytest.raises(ValueError, match="would hold both"):
        mapping.plan(names, table)
    plan = mapping.plan(names, table, shared=True)
    same = np.ones((3, 2))
    assert list(mapping.write(plan, {n: same for n in names})) == ["pos"]
    with pytest.raises(ValueError, match="share 'pos' but differ"):
        mapping.write(plan, {"src_pos.embedding": same, "tgt_pos.embedding": 2 * same})


def _twin_tables():
    import tf_impl
    import torch_impl
    from tf_impl.saved_names import weights_h5_table

    return {"torch": torch_impl.weight_table, "keras": tf_impl.weight_table, "keras .weights.h5": weights_h5_table}


@pytest.mark.parametrize("family", ["encoder-decoder", "encoder-only", "decoder-only"])
def test_the_twins_tables_round_trip_every_parameter(family):
    config = {"encoder-decoder": rn.TransformerConfig.preset("tiny"),
              "encoder-only": rn.TransformerConfig.preset("tiny", num_decoder_layers=0, type_vocab_size=2,
                                                          embed_norm=True, pooler=True, head_transform=True,
                                                          positional="learned"),
              "decoder-only": rn.TransformerConfig.preset("tiny", num_encoder_layers=0, tie_embeddings=True,
                                                          embed_bias=True)}[family]
    weights = rn.init_weights(config, seed=3)
    for name, table_of in _twin_tables().items():
        table = table_of(config)
        state = rn.to_framework_state(config, weights, table)
        assert len(state) == len(weights), name
        back = rn.from_framework_state(config, state, table)
        assert back.keys() == weights.keys()
        for key in weights:
            np.testing.assert_array_equal(back[key], weights[key], err_msg=f"{name}: {key}")


def test_a_missing_or_unexpected_key_is_named():
    config = rn.TransformerConfig.preset("tiny")
    import torch_impl

    state = rn.to_framework_state(config, rn.init_weights(config), torch_impl.weight_table(config))
    state["extra.weight"] = state.pop("encoder.layers.0.norm1.weight")
    with pytest.raises(ValueError, match="missing 1: encoder.layers.0.norm1.weight; unexpected 1: extra.weight"):
        rn.from_framework_state(config, state, torch_impl.weight_table(config))


def test_k_and_v_fused_apart_from_q_read_and_write_back():
    """`{kv}` (an attention library's `to_kv`: one Linear holding k then v, q apart): read into k and v, written
    back into one array equal to the original."""
    d, rng = 6, np.random.default_rng(3)
    table = [("encoder.layers.{i}.self_attn.q.kernel", "l.{i}.to_q.weight", "transpose"),
             ("encoder.layers.{i}.self_attn.{kv}.kernel", "l.{i}.to_kv.weight", "fused_qkv_t")]
    state = {"l.0.to_q.weight": rng.standard_normal((d, d)), "l.0.to_kv.weight": rng.standard_normal((2 * d, d))}
    names = [f"encoder.layers.0.self_attn.{p}.kernel" for p in "qkv"]
    plan = mapping.plan(names, table)
    weights = mapping.read(plan, dict(state), {n: (d, d) for n in names})
    np.testing.assert_array_equal(weights[names[1]], state["l.0.to_kv.weight"][:d].T)  # k first
    np.testing.assert_array_equal(weights[names[2]], state["l.0.to_kv.weight"][d:].T)
    back = mapping.write(plan, weights)
    assert set(back) == set(state) and all(np.array_equal(back[k], state[k]) for k in state)


def test_an_expert_index_reads_and_writes_every_expert_of_every_layer():
    """`{e}` (an expert's index: a mixture of experts stored one expert at a time, as `save_pretrained` writes
    Mixtral's `experts.{e}.w3`): every expert of every layer read through one entry, each transposed, and written back
    to the keys it came from; an index written otherwise than Python writes an int is not an expert's."""
    rng = np.random.default_rng(5)
    table = [("decoder.layers.{i}.ffn.experts.{e}.linear1.kernel", "layers.{i}.experts.{e}.w3.weight", "transpose")]
    names = [f"decoder.layers.{i}.ffn.experts.{e}.linear1.kernel" for i in range(2) for e in range(11)]
    state = {f"layers.{i}.experts.{e}.w3.weight": rng.standard_normal((4, 3)) for i in range(2) for e in range(11)}
    plan = mapping.plan(names, table)
    weights = mapping.read(plan, dict(state), {n: (3, 4) for n in names})
    np.testing.assert_array_equal(weights["decoder.layers.1.ffn.experts.10.linear1.kernel"],
                                  state["layers.1.experts.10.w3.weight"].T)
    back = mapping.write(plan, weights)
    assert list(back) == list(state) and all(np.array_equal(back[k], state[k]) for k in state)
    assert mapping.regex(table[0][1]).fullmatch("layers.0.experts.01.w3.weight") is None
    assert mapping.placeholders(table[0][0]) == {"i", "e"}


def test_expert_banks_split_and_join():
    """A layer's experts stacked on the first axis (`expert_bank`: GPT-OSS's `down_proj` `(E, I, D)`), and with
    gate and linear1 interleaved in the last axis (`expert_bank_interleaved`: its `gate_up_proj` `(E, D, 2I)`, gate
    at [..., ::2], up at [..., 1::2]; biases `(E, 2I)` alike); the engine plans, writes and reads them both ways and
    counts the experts from the names it plans."""
    rng = np.random.default_rng(2)
    experts, d, inner = 3, 5, 4
    shapes = {}
    for e in range(experts):
        shapes.update({f"ffn.experts.{e}.gate.kernel": (d, inner), f"ffn.experts.{e}.gate.bias": (inner,),
                       f"ffn.experts.{e}.linear1.kernel": (d, inner), f"ffn.experts.{e}.linear1.bias": (inner,),
                       f"ffn.experts.{e}.linear2.kernel": (inner, d)})
    weights = {name: rng.standard_normal(shape) for name, shape in shapes.items()}
    table = [("ffn.experts.{e}.{gate_up}.kernel", "experts.gate_up_proj", "expert_bank_interleaved"),
             ("ffn.experts.{e}.{gate_up}.bias", "experts.gate_up_proj_bias", "expert_bank_interleaved"),
             ("ffn.experts.{e}.linear2.kernel", "experts.down_proj", "expert_bank")]
    plan = mapping.plan(shapes, table)
    external = mapping.write(plan, dict(weights))
    assert {k: v.shape for k, v in external.items()} == {"experts.gate_up_proj": (3, 5, 8),
                                                          "experts.gate_up_proj_bias": (3, 8),
                                                          "experts.down_proj": (3, 4, 5)}
    np.testing.assert_array_equal(external["experts.gate_up_proj"][1, :, ::2], weights["ffn.experts.1.gate.kernel"])
    np.testing.assert_array_equal(external["experts.gate_up_proj"][2, :, 1::2], weights["ffn.experts.2.linear1.kernel"])
    np.testing.assert_array_equal(external["experts.gate_up_proj_bias"][0, 1::2], weights["ffn.experts.0.linear1.bias"])
    np.testing.assert_array_equal(external["experts.down_proj"][2], weights["ffn.experts.2.linear2.kernel"])
    assert mapping.canonical_shape("expert_bank_interleaved", (3, 5, 8)) == (5, 4)
    assert mapping.canonical_shape("expert_bank", (3, 4, 5)) == (4, 5)
    back = mapping.read(plan, dict(external), shapes)
    assert all(np.array_equal(back[name], weights[name]) for name in shapes)
    with pytest.raises(ValueError, match="stacks a layer's experts"):
        mapping.check_table([("ffn.experts.{e}.linear2.kernel", "experts.{e}.down_proj", "expert_bank")])
    with pytest.raises(ValueError, match="numbered from 0 without gaps"):
        mapping.fused_groups(mapping.plan([n for n in shapes if ".experts.0." not in n], table))
