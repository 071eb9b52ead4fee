"""raydist: distributed PyTorch training on Ray, for SLURM clusters and local machines.

`raydist.fit(...)` (raydist/api.py) runs a job from Python; it is imported on first use, so that `import raydist`
stays light."""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "fit":
        from raydist.api import fit

        return fit
    raise AttributeError(f"module 'raydist' has no attribute {name!r}")
