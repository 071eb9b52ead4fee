"""Desync detection: replicas that should be identical, compared every `faults.desync_every_steps` steps.

At a check, every rank contributes two numbers to the loop's one all-reduce at that sync point (no extra
collective): the norm of its own gradient before any exchange, and a checksum of its parameters after the step.
Where the strategy says replicas agree (sync DDP every step, local SGD right after an all-reduce averaging), the
checksums must match; a rank whose gradient norm is not finite is named too. Local gradient norms differ between
ranks by design (each has its own batch), so their spread only warns, and only when asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SLOTS = 2  # per rank: local gradient norm, parameter checksum


class DesyncError(RuntimeError):
    """Raised on every rank when faults.on_desync=restart: Ray Train restarts the workers from the last checkpoint."""


@dataclass(frozen=True)
class Finding:
    ranks: list[int]
    """The ranks that disagree with the others (or hold non-finite values)."""
    what: str
    """One line, without the step."""
    act: bool
    """True for a desync (act per faults.on_desync); False for a warning only (gradient-norm spread)."""


def param_checksum(model: torch.nn.Module) -> torch.Tensor:
    """Sum of absolute parameter values in float64: one pass, and a perturbation of any sign moves it. Of a
    sharded model (DTensor parameters), this rank's shards: no collective."""
    return torch.stack([(p.to_local() if hasattr(p, "to_local") else p).detach().double().abs().sum()
                        for p in model.parameters()]).sum()


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b))


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def compare(grad_norms: list[float], checksums: list[float] | None, tol: float, grad_tol: float) -> list[Finding]:
    """What is wrong with these per-rank fingerprints (rank i's at index i); [] when nothing is.

    `checksums` is None where replicas need not agree. The reference checksum is the one most ranks share (the
    lowest rank's group on a tie), so with two ranks the one named is the one that differs from rank 0."""
    findings: list[Finding] = []
    W = len(grad_norms)
    bad_grad = [r for r, g in enumerate(grad_norms) if not math.isfinite(g)]
    if bad_grad:
        findings.append(Finding(bad_grad, f"non-finite local gradient norm on {_ranks(bad_grad)}", act=True))
    if checksums is not None and W > 1:
        bad = [r for r, c in enumerate(checksums) if not math.isfinite(c)]
        finite = [r for r in range(W) if r not in bad]
        if bad:
            findings.append(Finding(bad, f"non-finite parameters on {_ranks(bad)}", act=True))
        if finite:
            support = {r: sum(_close(checksums[r], checksums[o], tol) for o in finite) for r in finite}
            ref = max(finite, key=lambda r: (support[r], -r))
            off = [r for r in finite if not _close(checksums[r], checksums[ref], tol)]
            if off:
                worst = max(abs(checksums[r] - checksums[ref]) / max(abs(checksums[ref]), 1e-300) for r in off)
                findings.append(Finding(
                    off, f"parameters of {_ranks(off)} differ from rank {ref}'s (relative difference {worst:.2g} "
                    f"> faults.desync_tolerance={tol:g})", act=True))
    if grad_tol > 0 and W > 1:
        finite_norms = sorted(g for g in grad_norms if math.isfinite(g))
        if finite_norms:
            median = finite_norms[len(finite_norms) // 2]
            far = [r for r, g in enumerate(grad_norms) if math.isfinite(g) and abs(g - median) > grad_tol * median]
            if far:
                spread = ", ".join(f"{grad_norms[r]:.3g}" for r in far)
                findings.append(Finding(
                    far, f"local gradient norm of {_ranks(far)} ({spread}) is more than "
                    f"{grad_tol:.0%} from the median {median:.3g} (faults.grad_norm_tolerance)", act=False))
    return findings
