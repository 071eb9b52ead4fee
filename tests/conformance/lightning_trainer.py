"""A Lightning `Trainer` script: Lightning finds its launcher in the environment (TorchElasticEnvironment under
torchrun and raydist launch, SLURMEnvironment under srun) and runs DDP over it. Rank 0 prints one CONFORMANCE line.

    torchrun --standalone --nproc-per-node 2 tests/conformance/lightning_trainer.py
    raydist launch --workers 2 -- python tests/conformance/lightning_trainer.py
"""

import json
import os
import warnings

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    pl.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 16, generator=g)
    data = TensorDataset(x, (x[:, :4].sum(1) > 0).long())
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("SLURM_NNODES", "1")))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", "1")))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=nodes,
        strategy="ddp",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    model = Net()
    trainer.fit(model, DataLoader(data, batch_size=32, shuffle=True))
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    if trainer.global_rank == 0:
        env = type(trainer.strategy.cluster_environment).__name__
        print(
            "CONFORMANCE "
            + json.dumps(
                {
                    "script": "lightning_trainer",
                    "world": trainer.world_size,
                    "steps": trainer.global_step,
                    "loss": f"{trainer.callback_metrics['loss'].item():.6f}",
                    "checksum": f"{checksum:.10e}",
                    "env": {"cluster_environment": env},
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
