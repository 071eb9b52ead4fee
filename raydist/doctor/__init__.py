"""`raydist doctor`: what is wrong with a cluster before a training run finds out the hard way.

checks.py    pure verdicts: facts in, table rows (ok / warn / fail / skip, with a reason) out
facts.py     what one node knows about itself, through injectable probes
bandwidth.py timed torch.distributed loops (ring point-to-point, all-reduce) and the bandwidth arithmetic
agent.py     the per-node part: a plain class that a Ray actor runs on each node
runner.py    the driver: places one agent per alive node, runs the phases, each bounded in time
report.py    the one table, --json, and the exit line
command.py   the `raydist doctor` sub-command
"""
