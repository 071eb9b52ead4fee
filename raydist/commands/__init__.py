"""Sub-commands of the `raydist` console script."""
