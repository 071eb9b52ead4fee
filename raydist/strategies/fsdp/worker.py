"""Fully sharded data parallel (FSDP2, `torch.distributed.fsdp.fully_shard`): each rank holds 1/W of every parameter,
of its gradient and of its optimizer state.

Every layer with parameters is its own FSDP unit, then the whole model: a unit's full parameters exist only while its
forward or backward runs (all-gathered, then freed with `fsdp.reshard_after_forward`), and its gradients are
reduce-scattered, so each rank's optimizer steps only its own shard. Every step is a sync point, as for sync DDP, and
the losses are the same model's: on CPU with two workers an FSDP run matches sync DDP's up to float rounding.

Checkpoints are sharded: every rank writes its own shards with `torch.distributed.checkpoint` (DCP) into one
directory on the run's shared storage, and rank 0 adds the loop's state file and the manifest once all shards are
written (`raydist.train.restore.Restorer.save`). DCP reshards on load, so a checkpoint resumes with another worker count.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
import torch.distributed as dist

from raydist.errors import RaydistError
from raydist.torchkit.commstats import allreduce_bytes, tensor_bytes
from raydist.train.strategy import ShardedState, Strategy, held_param_bytes

MODEL_KEY, OPTIM_KEY = "model", "optimizer"
"""The two entries of the DCP state dict; the loop's `train_state.pt` beside it holds everything else."""


def outer_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules below the root that hold parameters of their own, outermost first, each with everything inside
    it: a layer whose forward reads its children's weights directly (nn.MultiheadAttention reads its out_proj's)
    must gather them with its own, so a child of such a layer is never a unit of its own."""
    found = []
    for child in model.children():
        if next(child.parameters(recurse=False), None) is not None:
            found.append(child)
        else:
            found += outer_layers(child)
    return found


class FSDP(Strategy, ShardedState):
    name = "fsdp"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        if not dist.is_initialized():
            raise RaydistError("fsdp needs a torch.distributed process group (Ray Train or torchrun sets one up)")
        self.model = model
        # The model's structure without storage: evaluation loads the gathered full parameters into a copy of it.
        self.skeleton = copy.deepcopy(model).to("meta")
        reshard = self.cfg.fsdp.reshard_after_forward
        # Every layer with parameters of its own is a unit (or the units the model names), then the root.
        units = getattr(model, "fsdp_units", None) or outer_layers(model)
        for module in units:
            fully_shard(module, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        full = tensor_bytes(self.skeleton)
        # Per step: the forward's all-gather, the backward's again when the forward resharded, the gradients'
        # reduce-scatter; each moves (W-1)/W of the parameters out and as much in, half a ring all-reduce.
        self.step_bytes = (3 if reshard else 2) * allreduce_bytes(full, self.world_size) / 2
        return model

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        # Only the step's last micro-batch reduce-scatters: the others accumulate unsharded gradients locally.
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        # The gradients are DTensor shards; clipping all-reduces their norm, which comes back as a DTensor.
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def synchronize(self, final: bool) -> None:
        self.comm.add(self.step_bytes)  # the gathers and the reduce-scatter already ran in forward and backward

    # No DesyncCheck: with W > 1 no two ranks hold the same parameters (each its own shard), so the desync check
    # compares no checksums and only looks for non-finite gradient norms.

    def eval_model(self, final: bool) -> torch.nn.Module:
        """A plain full copy (every rank gathers the parameters once): ranks score test slices of different
        lengths, and the sharded model's forward is a collective every rank would have to run alike."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        plain = copy.deepcopy(self.skeleton)
        plain.load_state_dict(full, assign=True)
        return plain.to(self.ctx.device)

    # ---- sharded checkpoints ---------------------------------------------------------------------------------

    def save_sharded(self, directory: str, optimizer: torch.optim.Optimizer) -> None:
        """Every rank writes its shards of the model and optimizer into `directory` (one file per rank, plus
        DCP's `.metadata` from rank 0, written after every rank's files are)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, optimizer)
        dcp.save({MODEL_KEY: model_state, OPTIM_KEY: optim_state}, checkpoint_id=directory)

    def load_sharded(self, directory: str, optimizer: torch.optim.Optimizer) -> None:
        """Every rank reads the parts of the saved shards it holds now (DCP reshards for another world size)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(self.model, optimizer)
        state: dict[str, Any] = {MODEL_KEY: model_state, OPTIM_KEY: optim_state}
        dcp.load(state, checkpoint_id=directory)
        set_state_dict(self.model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIM_KEY])

    def describe(self) -> str:
        held, full = held_param_bytes(self.model), tensor_bytes(self.skeleton)
        return (
            f"parameters sharded over {self.world_size} ranks ({held / 1e6:.2f} of {full / 1e6:.2f} MB on rank "
            f"{self.ctx.rank}), reshard_after_forward={str(self.cfg.fsdp.reshard_after_forward).lower()}"
        )
