"""Heal in place (torchft): one replica group per worker; a dead worker is replaced while the others keep stepping,
and the replacement takes the live state from a peer instead of a checkpoint."""
