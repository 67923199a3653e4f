"""Keras models built in code with random weights (no downloads), for the TensorFlow frontend's tests.

A BERT-style encoder and a GPT-style decoder from Keras layers (``MultiHeadAttention``,
``LayerNormalization``, ``Dense`` with GELU, ``Embedding``), and ``keras.applications``
ResNet50, MobileNetV2 and EfficientNetB0 with ``weights=None`` (no classifier head: a
classifier needs a static image size; global average pooling instead)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


class Encoder(keras.Model):
    """A BERT-style encoder: token + position embeddings, post-LayerNorm blocks, a padding mask."""

    def __init__(self, vocab: int = 100, width: int = 32, heads: int = 4, layers: int = 2, causal: bool = False, positions: int = 128) -> None:
        super().__init__()
        self.causal = causal
        self.tokens = keras.layers.Embedding(vocab, width)
        self.positions = keras.layers.Embedding(positions, width)
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.blocks = [
            (
                keras.layers.MultiHeadAttention(heads, width // heads),
                keras.layers.LayerNormalization(epsilon=1e-6),
                keras.layers.Dense(4 * width, activation="gelu"),
                keras.layers.Dense(width),
                keras.layers.LayerNormalization(epsilon=1e-6),
            )
            for _ in range(layers)
        ]
        self.head = keras.layers.Dense(vocab) if causal else None

    def call(self, ids, mask=None):
        n = tf.shape(ids)[1]
        x = self.norm(self.tokens(ids) + self.positions(tf.range(n))[None])
        attention_mask = None if mask is None else tf.cast(mask[:, None, :], tf.bool)
        for attention, norm1, up, down, norm2 in self.blocks:
            a = attention(x, x, attention_mask=attention_mask, use_causal_mask=self.causal)
            x = norm1(x + a)
            x = norm2(x + down(up(x)))
        return self.head(x) if self.head is not None else {"hidden": x, "pooled": tf.reduce_mean(x, axis=1)}


def bert() -> tuple[keras.Model, list]:
    keras.utils.set_random_seed(0)
    model = Encoder()
    sig = [tf.TensorSpec([None, None], tf.int32, name="ids"), tf.TensorSpec([None, None], tf.int32, name="mask")]
    return model, sig


def gpt() -> tuple[keras.Model, list]:
    keras.utils.set_random_seed(1)
    return Encoder(layers=2, causal=True), [tf.TensorSpec([None, None], tf.int32, name="ids")]


def cnn(name: str) -> tuple[keras.Model, list]:
    keras.utils.set_random_seed(2)
    model = getattr(keras.applications, name)(weights=None, include_top=False, pooling="avg", input_shape=(None, None, 3))
    return model, [tf.TensorSpec([None, None, None, 3], tf.float32, name="image")]
