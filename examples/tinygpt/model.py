"""TinyGPT: token and position embeddings, pre-norm causal self-attention blocks, a linear head over the vocabulary.

raydist config show --set model.factory=tinygpt.model:make_model --set data.factory=tinygpt.data:make_datasets
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Next-token scores for every position: input [batch, tokens] of token ids, output [batch, tokens, vocab]."""

    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.zeros(1, context, width))
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=ids.device), diagonal=1)  # no peeking ahead
        x = self.tokens(ids) + self.positions[:, :n]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def make_model(
    vocab: int = 64, context: int = 32, width: int = 64, layers: int = 2, heads: int = 4, dropout: float = 0.0
) -> TinyGPT:
    """model.factory: every argument is a key of model.args."""
    return TinyGPT(vocab, context, width, layers, heads, dropout)
