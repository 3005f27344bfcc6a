"""The NumPy reference Transformer: the contract every backend maps to (config, canonical weights, the math).

Importing this package pulls in NumPy only.
"""

from .config import PRESETS, TransformerConfig
from .inputs import sample_batch, sample_ids, sample_type_ids
from .io import load_weights, save_weights
from .model import (Decoder, DecoderLayer, Embedding, Encoder, EncoderLayer, FeedForward, HeadTransform, LayerNorm,
                    MultiHeadAttention, Pooler, Transformer, check_family, check_padding_mask, check_stack,
                    check_token_ids, check_type_ids, eos_mask, rows_seeing_no_key)
from .ops import (attention_mask, causal_mask, padding_mask, scaled_dot_product_attention, sinusoidal_positions)
from . import alibi, mapping
from .schema import (from_framework_state, init_weights, parameter_shapes, to_framework_state, validate_weights,
                     weights_dtype)
from .training import (SCHEDULES, AdamSettings, Schedule, adam_update, cosine_lr, noam_lr, token_cross_entropy)
from .tasks import BOS_ID, EOS_ID, PAD_ID, TASKS, Batch, TaskSpec, accuracy, check_config
from .decoding import choose_next, generate, reference_stepper

__all__ = [
    "rows_seeing_no_key",
    "PRESETS", "TransformerConfig", "sample_batch", "sample_ids", "sample_type_ids", "load_weights", "save_weights",
    "Decoder", "DecoderLayer", "Embedding", "Encoder", "EncoderLayer", "FeedForward", "HeadTransform", "LayerNorm",
    "MultiHeadAttention", "Pooler", "Transformer", "check_family", "check_padding_mask", "check_stack",
    "check_token_ids", "check_type_ids", "eos_mask", "attention_mask", "causal_mask", "padding_mask",
    "scaled_dot_product_attention", "sinusoidal_positions", "mapping", "from_framework_state", "init_weights",
    "parameter_shapes", "to_framework_state", "validate_weights", "weights_dtype", "SCHEDULES", "AdamSettings",
    "Schedule", "adam_update", "cosine_lr", "noam_lr", "token_cross_entropy", "BOS_ID", "EOS_ID", "PAD_ID", "TASKS",
    "Batch", "TaskSpec", "accuracy", "check_config", "choose_next", "generate", "reference_stepper",
]
