"""A node's warm interpreter: Python with torch and raydist imported, beside every Ray worker of the
node (the embedded instance or a SLURM node), from which Ray's workers and `raydist launch --set warm=true` ranks
are forked."""
