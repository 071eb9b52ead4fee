"""Downpour SGD on Ray actors: parameter-server shards, workers, the driver that places and checkpoints them."""
