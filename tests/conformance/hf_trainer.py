"""A Hugging Face `Trainer` script: a tiny GPT-2 built from its config (no download), synthetic tokens; the Trainer
(through accelerate) finds the distributed setting from torchrun's variables. Rank 0 prints one CONFORMANCE line.

    torchrun --standalone --nproc-per-node 2 tests/conformance/hf_trainer.py OUTPUT_DIR
    raydist launch --workers 2 -- python tests/conformance/hf_trainer.py OUTPUT_DIR
"""

import json
import sys
import warnings

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed
from transformers.utils import logging

warnings.filterwarnings("ignore")
logging.set_verbosity_error()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=256, length=16, vocab=64):
        g = torch.Generator().manual_seed(1)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (start + torch.arange(length)) % vocab  # a counting sequence: learnable

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    set_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=sys.argv[1],
        per_device_train_batch_size=8,
        num_train_epochs=2,
        learning_rate=1e-3,
        seed=0,
        data_seed=0,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    result = trainer.train()
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    if trainer.is_world_process_zero():
        print(
            "CONFORMANCE "
            + json.dumps(
                {
                    "script": "hf_trainer",
                    "world": args.world_size,
                    "steps": result.global_step,
                    "loss": f"{result.training_loss:.6f}",
                    "checksum": f"{checksum:.10e}",
                    "env": {
                        "parallel_mode": str(args.parallel_mode).split(".")[-1],
                        "distributed_type": str(trainer.accelerator.distributed_type).split(".")[-1],
                    },
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
