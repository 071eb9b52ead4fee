"""Synthetic token sequences with structure to learn: each sequence follows a rule x[t+1] = (a x[t] + b) mod V drawn
from a few rules, with some tokens replaced by noise. A model that infers the rule from the context predicts most
next tokens; one that does not stays near chance (1/V). Generated from a seed: the same on every node."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class SyntheticTokens(Dataset):
    """(input ids [context], next-token targets [context]) pairs; sample i is the same wherever it is generated."""

    def __init__(self, samples: int, vocab: int, context: int, rules: int, noise: float, seed: int, part: int):
        g = torch.Generator().manual_seed(seed)  # the rules: the same for the train and the test part
        a = torch.randint(1, vocab, (rules,), generator=g)
        b = torch.randint(0, vocab, (rules,), generator=g)
        g = torch.Generator().manual_seed(seed * 1000 + part + 1)  # the sequences: each part its own
        rule = torch.randint(0, rules, (samples,), generator=g)
        seq = torch.empty(samples, context + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, vocab, (samples,), generator=g)
        for t in range(context):
            seq[:, t + 1] = (a[rule] * seq[:, t] + b[rule]) % vocab
        noisy = torch.rand(samples, context + 1, generator=g) < noise
        seq[noisy] = torch.randint(0, vocab, (int(noisy.sum()),), generator=g)
        self.inputs, self.targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


def make_datasets(
    samples: int = 4096,
    test_samples: int = 512,
    vocab: int = 64,
    context: int = 32,
    rules: int = 4,
    noise: float = 0.05,
    seed: int = 0,
) -> tuple[SyntheticTokens, SyntheticTokens]:
    """data.factory: (train, test), every argument a key of data.args; the same rules, other sequences."""
    return (
        SyntheticTokens(samples, vocab, context, rules, noise, seed, part=0),
        SyntheticTokens(test_samples, vocab, context, rules, noise, seed, part=1),
    )
