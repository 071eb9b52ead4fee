"""Downpour SGD on Ray actors: parameter-server shards, workers, the driver that places and checkpoints them."""

STRATEGY = "async"  # its registry name, as the driver's summary, console lines and metrics give it
