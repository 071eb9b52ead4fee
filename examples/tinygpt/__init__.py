"""A small but real project: a GPT-style language model on synthetic token sequences, nothing downloaded.

Used three ways (docs/your-code.md), each file with its exact command on top:
- `train.py`: an ordinary DDP script, unmodified, under `raydist launch` (or torchrun, or srun);
- `tinygpt.yaml`: the same model and data by import path, with every raydist strategy (`model.factory`, `data.factory`);
- `fit_api.py`: the same through the Python API, `raydist.fit(...)`.
"""
