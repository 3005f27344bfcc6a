"""A mixture-of-experts feed-forward as a Keras layer, as `reference_numpy.model.MixtureOfExperts` and
`reference_numpy.moe` compute it (the same class in `torch_impl.moe`): the router picks each token's experts, the
tokens are gathered by expert (each expert runs once on the tokens that chose it; static shapes but for the number of
such tokens, so it runs eagerly, in `tf.function` and under XLA).

Ties: `tf.math.top_k` keeps the lowest ids among equal scores, `torch.topk` on the CPU (transformers' routers, and
the reference) whatever its selection algorithm leaves. A row of equal scores (all-zero hidden states, a zero router)
takes torch's choice here too (`reference_numpy.moe.tied_top_k`); a tie among only some experts at the k-th place
(two identical router columns) is the one case this layer routes otherwise, and `verify` names it at the routing
record.
"""

from __future__ import annotations

from typing import Callable

from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)
import keras  # noqa: E402

from reference_numpy import TransformerConfig
from reference_numpy.moe import tied_top_k


def route(logits: tf.Tensor, config: TransformerConfig) -> tuple[tf.Tensor, tf.Tensor]:
    """Router scores `(N, num_experts)` -> `(ids, weights)`, each `(N, k)` (`router_softmax`, `router_renormalize`;
    the softmax in float32 at least)."""
    k = config.experts_per_token
    work = logits if logits.dtype in (tf.float32, tf.float64) else tf.cast(logits, tf.float32)
    scores = work if config.router_softmax == "after_topk" else tf.nn.softmax(work, axis=-1)
    weights, ids = tf.math.top_k(scores, k)
    tied = tf.reduce_max(scores, axis=-1) == tf.reduce_min(scores, axis=-1)  # (N,): every expert scores alike
    ids = tf.where(tied[:, None], tf.constant(tied_top_k(config.num_experts, k), dtype=ids.dtype)[None], ids)
    if config.router_softmax == "after_topk":
        weights = tf.nn.softmax(weights, axis=-1)
    elif config.router_renormalize:
        weights = weights / tf.reduce_sum(weights, axis=-1, keepdims=True)
    return ids, tf.cast(weights, logits.dtype)


class MixtureOfExperts(keras.layers.Layer):
    """The router `(d_model, num_experts)`, the experts (`feed_forward(config, width, name=...)`, the model's
    FeedForward, of `expert_d_ff`) and the sigmoid-gated shared expert where `shared_expert_d_ff` says. `call(x)` ->
    `(out, routing)`: `routing` the experts each token chose, ascending, `(B, T, k)` in x's dtype."""

    def __init__(self, config: TransformerConfig, feed_forward: Callable[..., keras.layers.Layer], **kwargs):
        super().__init__(**kwargs)
        self.config = config
        dense = dict(use_bias=False, dtype=self.dtype_policy)
        self.router = keras.layers.Dense(config.num_experts, **{**dense, "use_bias": config.router_bias},
                                         name="router")
        self.experts = [feed_forward(config, config.expert_width, dtype=self.dtype_policy, name=f"experts_{e}")
                        for e in range(config.num_experts)]
        shared = config.shared_expert_d_ff
        self.shared = feed_forward(config, shared, dtype=self.dtype_policy, name="shared") if shared else None
        self.shared_gate = keras.layers.Dense(1, **dense, name="shared_gate") if shared else None

    def build(self, x_shape):
        flat = (None, self.config.d_model)
        self.router.build(flat)
        for expert in self.experts:
            expert.build(x_shape)
        if self.shared is not None:
            self.shared.build(x_shape)
            self.shared_gate.build(flat)

    def call(self, x, training: bool = False):
        shape = tf.shape(x)
        flat = tf.reshape(x, (-1, self.config.d_model))  # (B, T, D) -> (N, D)
        ids, weights = route(self.router(flat), self.config)  # (N, k) each
        out = tf.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            hit = tf.equal(ids, e)  # (N, k): a token chooses an expert at most once
            rows = tf.where(tf.reduce_any(hit, axis=-1))[:, 0]  # the tokens that chose e
            weight = tf.gather(tf.reduce_sum(tf.where(hit, weights, tf.zeros_like(weights)), axis=-1), rows)
            y = expert(tf.gather(flat, rows)[None], training=training)[0] * weight[:, None]
            out = tf.tensor_scatter_nd_add(out, rows[:, None], y)
        if self.shared is not None:
            out = out + tf.sigmoid(self.shared_gate(flat)) * self.shared(flat[None], training=training)[0]
        routing = tf.reshape(tf.sort(ids, axis=-1), tf.concat([shape[:-1], [-1]], axis=0))
        return tf.reshape(out, shape), tf.cast(routing, x.dtype)
