"""The emulated SLURM cluster (emucluster.py) the `slurm` tests and the cluster benchmarks run on; `setup` and
`teardown` beside it start and stop one by hand."""
