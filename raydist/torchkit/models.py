"""The networks: the seeds' SimpleModel, an MLP, a small CNN for 8x8 images and a small transformer encoder."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from raydist.config import ModelConfig
from raydist.torchkit.data import Splits
from raydist.torchkit.model_size import SIMPLE_HIDDEN, mlp_width, transformer_width


class SimpleModel(nn.Module):
    """The seeds' model: in -> 50 -> out with a ReLU (10 -> 50 -> 2 on the default synthetic data)."""

    def __init__(self, in_features: int = 10, out_features: int = 2):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, SIMPLE_HIDDEN), nn.ReLU(), nn.Linear(SIMPLE_HIDDEN, out_features)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MLP(nn.Module):
    def __init__(self, in_features: int, out_features: int, hidden: int, depth: int, dropout: float):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Two 3x3 conv layers and a linear head; sized for 8x8 digits."""

    def __init__(self, image_shape: tuple[int, int, int], out_features: int, dropout: float):
        super().__init__()
        c, h, w = image_shape
        self.image_shape = image_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(32 * (h // 2) * (w // 2), out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, *self.image_shape)))


@dataclasses.dataclass(frozen=True)
class TransformerShape:
    """The sizes of a TinyTransformer."""

    in_features: int
    """Input features, cut into `tokens` equal pieces (a remainder is not used)."""
    out_features: int
    """Outputs of the head: the classes."""
    tokens: int
    """Tokens the input is cut into (digits: their 8 rows)."""
    width: int
    """The model width: each token's embedding; a multiple of `heads`."""
    heads: int
    """Attention heads of each encoder layer."""
    depth: int
    """Encoder layers."""
    dropout: float = 0.0
    """Dropout probability inside each encoder layer."""


class TinyTransformer(nn.Module):
    """A pre-norm transformer encoder over the input cut into `tokens` equal pieces (digits: its 8 rows of 8
    pixels, as a ViT cuts patches), each embedded linearly with a learned position; mean-pooled into a linear head."""

    def __init__(self, shape: TransformerShape):
        super().__init__()
        in_features, out_features, tokens, width = shape.in_features, shape.out_features, shape.tokens, shape.width
        heads, depth, dropout = shape.heads, shape.depth, shape.dropout
        self.tokens, self.piece = tokens, in_features // tokens
        self.embed = nn.Linear(self.piece, width)
        self.position = nn.Parameter(torch.zeros(tokens, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout, batch_first=True, norm_first=True)
        # No nested tensors: they need post-norm layers and would only print a warning.
        self.encoder = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(width), enable_nested_tensor=False)
        self.head = nn.Linear(width, out_features)

    @property
    def fsdp_units(self) -> list[nn.Module]:
        """FSDP's units: each encoder layer whole (its attention calls its output projection's weight directly,
        never the module, so that projection cannot be a unit of its own)."""
        return list(self.encoder.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.view(-1, self.tokens, self.piece)) + self.position
        return self.head(self.encoder(h).mean(dim=1))


def build_model(cfg: ModelConfig, data: Splits) -> nn.Module:
    """Your model.factory's module, or the built-in model.name sized for `data`."""
    if cfg.factory:
        from raydist.factories import user_model

        return user_model(cfg.factory, cfg.args, data)
    if cfg.name == "simple":
        return SimpleModel(data.num_features, data.num_classes)
    if cfg.name == "mlp":
        hidden = mlp_width(cfg.params, data.num_features, data.num_classes, cfg.depth) if cfg.params else cfg.hidden
        return MLP(data.num_features, data.num_classes, hidden, cfg.depth, cfg.dropout)
    if cfg.name == "transformer":
        width = (
            transformer_width(cfg.params, data.num_features, data.num_classes, cfg.tokens, cfg.heads, cfg.depth)
            if cfg.params
            else cfg.hidden
        )
        return TinyTransformer(
            TransformerShape(data.num_features, data.num_classes, cfg.tokens, width, cfg.heads, cfg.depth, cfg.dropout)
        )
    assert data.image_shape is not None, "Config.validate rejects cnn without image data"
    return SmallCNN(data.image_shape, data.num_classes, cfg.dropout)
