"""Sweeps with Ray Tune (jobs/tune.py): one strategy's settings searched, each trial a run of its job."""
