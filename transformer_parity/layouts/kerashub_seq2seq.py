"""keras.io's "English-to-Spanish translation with KerasHub" model: an encoder-decoder assembled from
`keras_hub.layers.TokenAndPositionEmbedding` (with `mask_zero=True`), `TransformerEncoder`, `TransformerDecoder`
(with cross-attention), `Dropout(0.5)` and `Dense(vocab, activation="softmax")`, read from and written as the
`.weights.h5` that `transformer.save_weights()` writes (`transformer.load_weights()` reads ours).

The example's decoder is a nested `keras.Model`; the Keras mask of the encoder's output (from `mask_zero=True`) travels
into it with the encoder states, so its cross-attention masks the source's padding as the canonical model does
(measured with Keras 3.15: padded sources and targets agree with the reference to the float32 floor, and to 1e-10 in
float64, `parity_tests/test_kerashub.py`).

The math, read from keras-hub 0.32 (`layers/modeling/token_and_position_embedding.py`, `transformer_encoder.py`,
`transformer_decoder.py`): token + learned position embeddings, unscaled; post-LN layers (`normalize_first=False`),
ReLU, `layer_norm_epsilon=1e-05`; the decoder's self-attention causal; padding masks from token id 0
(`mask_zero=True`). The canonical logits are the Dense layer's input to its softmax. Nothing of this is stored in the
file, so the config is read off the weights (layer counts, widths, vocabularies, positions, heads from the einsum
kernels); `--set`/`--config` change what differs (e.g. `--set layer_norm_eps=1e-6` for a model built with another
epsilon). The table is the layout file `kerashub_seq2seq.toml`.
"""

from __future__ import annotations

from pathlib import Path

import reference_numpy as rn

from .family import KerasHubFamily

NAME = "kerashub-seq2seq"
LAYOUT = Path(__file__).with_name("kerashub_seq2seq.toml")
FIXED = {"activation": "relu", "layer_norm_eps": 1e-5, "norm_first": False, "final_norm": False,
         "positional": "learned", "position_offset": 0, "scale_embedding": False, "bias": True, "embed_norm": False,
         "head_transform": False, "type_vocab_size": 0, "pooler": False, "tie_embeddings": False,
         "share_embeddings": False, "output_projection": True, "pad_id": 0}


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not this model (empty if it is one); epsilon and activation are the layers' arguments, so
    any value is written (the user builds the model with them)."""
    fixed = {k: v for k, v in FIXED.items() if k not in ("activation", "layer_norm_eps", "pad_id")}
    problems = [f"{k}={getattr(config, k)!r} (the keras.io model has {v!r})" for k, v in fixed.items()
                if getattr(config, k) != v]
    if not config.is_encoder_decoder:
        problems.append("an encoder-decoder model is needed")
    if not config.has_output_bias:
        problems.append("output_bias=False (the Dense layer has a bias)")
    return problems


FAMILY = KerasHubFamily(
    name=NAME, backbone=None, backbones=(), tasks=(), serialized={},  # not a KerasHub backbone: no preset directory
    config_from_kerashub=None, export_problems=export_problems, config_to_kerashub=None,  # read off the weights
    task_config=None, config_keys={}, fixed=FIXED, task_fields={}, pad_token=None,  # the pad id is FIXED's 0
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=None, predicts_mask_positions=(), expresses=(), approximations=())
