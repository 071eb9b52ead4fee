"""raydist: distributed PyTorch training on Ray, for SLURM clusters and local machines.

`raydist.fit(...)` and `raydist.tune(...)` (raydist/api.py) run a job or a sweep from Python; it is imported on first use, so that `import raydist`
stays light."""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("fit", "tune"):
        from raydist import api

        return getattr(api, name)
    raise AttributeError(f"module 'raydist' has no attribute {name!r}")
