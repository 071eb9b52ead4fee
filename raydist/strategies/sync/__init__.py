"""Synchronous data parallel (PyTorch DDP): its worker (`worker.py`), cost terms (`cost.py`)."""
