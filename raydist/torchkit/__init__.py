"""The torch pieces every loop shares: models and data sets (built in or the user's by factory), samplers and
sharding, the optimizer, flat parameter buffers, seeding, communication counters, stragglers, checkpoints."""
