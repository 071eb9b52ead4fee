"""Ray clusters inside SLURM allocations: bring-up, readiness, connection file and teardown for cluster/ray_up.slurm."""
