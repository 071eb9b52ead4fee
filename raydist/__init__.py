"""raydist: distributed PyTorch training on Ray, for SLURM clusters and local machines."""

__version__ = "0.1.0"
