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

from raydist.config import Config
from raydist.train.strategy import DesyncCheck, Strategy, local_tensor

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
    return torch.stack(
        [(p.to_local() if hasattr(p, "to_local") else p).detach().double().abs().sum() for p in model.parameters()]
    ).sum()


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
                findings.append(
                    Finding(
                        off,
                        f"parameters of {_ranks(off)} differ from rank {ref}'s (relative difference {worst:.2g} "
                        f"> faults.desync_tolerance={tol:g})",
                        act=True,
                    )
                )
    if grad_tol > 0 and W > 1:
        finite_norms = sorted(g for g in grad_norms if math.isfinite(g))
        if finite_norms:
            median = finite_norms[len(finite_norms) // 2]
            far = [r for r, g in enumerate(grad_norms) if math.isfinite(g) and abs(g - median) > grad_tol * median]
            if far:
                spread = ", ".join(f"{grad_norms[r]:.3g}" for r in far)
                findings.append(
                    Finding(
                        far,
                        f"local gradient norm of {_ranks(far)} ({spread}) is more than "
                        f"{grad_tol:.0%} from the median {median:.3g} (faults.grad_norm_tolerance)",
                        act=False,
                    )
                )
    return findings


@dataclass(frozen=True)
class Verdict:
    """What faults.on_desync makes of a desync: every rank reaches the same one."""

    restart: bool
    """True: restart from the last checkpoint; False: end the run as failed, writing no further checkpoint."""
    why: str


class Watch:
    """The desync check as the loop runs it on one rank: this rank's fingerprint, and the verdict on everyone's. A
    strategy without `DesyncCheck` is compared as replicas only with one worker, on the loop's gradient norm."""

    def __init__(self, cfg: Config, rank: int, strategy: Strategy, fresh: bool):
        self.faults, self.rank, self.world_size = cfg.faults, rank, strategy.world_size
        self.check = strategy if isinstance(strategy, DesyncCheck) else None
        self.fresh = fresh
        """The run starts from scratch: faults.inject_desync_* acts once per run, not again after a restart."""

    def measure(self, due: bool) -> None:
        """Before a step: whether it is followed by a desync check."""
        if self.check is not None:
            self.check.measure_local_grad_norm(due)

    def fingerprint(self, model: torch.nn.Module, loop_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's local gradient norm (the strategy's, or else the loop's) and parameter checksum."""
        local = self.check.local_grad_norm() if self.check is not None else None
        return (local if local is not None else loop_norm).double(), param_checksum(model)

    def inject(self, model: torch.nn.Module, step: int) -> None:
        """faults.inject_desync_*: one rank nudges one parameter, once per run."""
        f = self.faults
        if f.inject_desync_rank == self.rank and step == f.inject_desync_step and self.fresh:
            with torch.no_grad():
                local_tensor(next(model.parameters())).view(-1)[0] += 1.0
            print(
                f"[raydist] faults.inject_desync_rank: rank {self.rank} perturbed a parameter after step {step}",
                flush=True,
            )

    def verdict(self, rows: list[list[float]], final: bool, step: int, last_checkpoint: int) -> Verdict | None:
        """Judge the fingerprints every rank sees alike (`rows`: per rank, as `fingerprint` made them); None when
        the run goes on (nothing found, or faults.on_desync=warn)."""
        f = self.faults
        agree = self.check.replicas_agree(final) if self.check is not None else self.world_size == 1
        findings = compare(
            [r[0] for r in rows], [r[1] for r in rows] if agree else None, f.desync_tolerance, f.grad_norm_tolerance
        )
        for finding in findings:
            if self.rank == 0:
                print(f"[raydist] desync at step {step}: {finding.what}", flush=True)
        acted = [x for x in findings if x.act]
        if not acted or f.on_desync == "warn":
            return None
        why = f"desync at step {step}: {acted[0].what}"
        if f.on_desync == "restart":
            return Verdict(True, f"{why} (faults.on_desync=restart: restarting from the last checkpoint)")
        return Verdict(False, f"{why} (faults.on_desync=stop: no checkpoint written after step {last_checkpoint})")
