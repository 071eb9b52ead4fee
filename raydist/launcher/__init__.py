"""`raydist launch`: a user's own torchrun- or srun-style script, unmodified, on every worker of the Ray cluster.

settings (the typed options), environment (each rank's variables, pure), policy (restart and hang decisions,
pure), agent (the Ray actor beside each rank), group (one start of the ranks), driver (the loop), summary, command
(the CLI).
"""
