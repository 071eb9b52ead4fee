"""Training strategies: what each worker runs (sync DDP here; async PS and local SGD beside it)."""
