"""FSDP2: fully sharded data parallel; its worker, config section, cost terms."""
