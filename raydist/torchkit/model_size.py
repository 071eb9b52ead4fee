"""How many parameters a built-in model (model.name) has, and the width that gives it `model.params`: sums of its
layers' weights and biases, without building it (the driver checks a run's size without importing torch).
tests/test_torchkit.py compares each with the built model's count."""

from __future__ import annotations

import math

from raydist.config import ModelConfig

SIMPLE_HIDDEN = 50
"""SimpleModel's one hidden layer (raydist.torchkit.models)."""


def simple_params(in_features: int, out_features: int) -> int:
    """Weights and biases of SimpleModel: in -> 50 -> out."""
    return (in_features + 1) * SIMPLE_HIDDEN + (SIMPLE_HIDDEN + 1) * out_features


def cnn_params(image_shape: tuple[int, int, int], out_features: int) -> int:
    """Weights and biases of SmallCNN: two 3x3 convolutions (16, then 32 channels) and a linear head over the
    32 channels pooled to half the height and width."""
    c, h, w = image_shape
    return (c * 9 + 1) * 16 + (16 * 9 + 1) * 32 + (32 * (h // 2) * (w // 2) + 1) * out_features


def transformer_params(in_features: int, out_features: int, tokens: int, width: int, depth: int) -> int:
    """Weights of TinyTransformer: embedding, positions, per layer 12 w^2 + 13 w (attention, a 4w MLP, two norms),
    the final norm and the head."""
    w = width
    return (in_features // tokens + 1) * w + tokens * w + depth * (12 * w * w + 13 * w) + 2 * w + (w + 1) * out_features


def transformer_width(params: int, in_features: int, out_features: int, tokens: int, heads: int, depth: int) -> int:
    """The width (a multiple of `heads`) whose TinyTransformer comes closest to `params` parameters."""
    count = lambda w: transformer_params(in_features, out_features, tokens, w, depth)  # noqa: E731
    w = heads
    while count(w + heads) <= params:
        w += heads
    return min((w, w + heads), key=lambda v: abs(count(v) - params))


def mlp_params(in_features: int, out_features: int, hidden: int, depth: int) -> int:
    """Weights and biases of MLP(in, out, hidden, depth)."""
    return (in_features + 1) * hidden + (depth - 1) * (hidden + 1) * hidden + (hidden + 1) * out_features


def mlp_width(params: int, in_features: int, out_features: int, depth: int) -> int:
    """The hidden width whose MLP comes closest to `params` parameters (at least 1)."""
    # (depth-1) h^2 + (in + 1 + (depth-1) + out) h + out = params: the positive root, then the better neighbour.
    a, b, c = depth - 1, in_features + depth + out_features, out_features - params
    h = -c / b if a == 0 else (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    candidates = {max(1, math.floor(h)), max(1, math.ceil(h))}
    return min(candidates, key=lambda w: abs(mlp_params(in_features, out_features, w, depth) - params))


def builtin_params(
    cfg: ModelConfig, in_features: int, out_features: int, image_shape: tuple[int, int, int] | None
) -> int:
    """The parameter count of the model raydist.torchkit.models.build_model builds for model.name (not a model.factory)."""
    if cfg.name == "simple":
        return simple_params(in_features, out_features)
    if cfg.name == "mlp":
        hidden = mlp_width(cfg.params, in_features, out_features, cfg.depth) if cfg.params else cfg.hidden
        return mlp_params(in_features, out_features, hidden, cfg.depth)
    if cfg.name == "transformer":
        width = (
            transformer_width(cfg.params, in_features, out_features, cfg.tokens, cfg.heads, cfg.depth)
            if cfg.params
            else cfg.hidden
        )
        return transformer_params(in_features, out_features, cfg.tokens, width, cfg.depth)
    assert image_shape is not None, "Config.validate rejects cnn without image data"
    return cnn_params(image_shape, out_features)
