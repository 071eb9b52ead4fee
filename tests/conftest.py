"""Shared pytest set-up."""

import sys
from pathlib import Path

# The emulated SLURM cluster lives in tests/cluster/ (see emucluster.py); its session fixture is shared here.
sys.path.insert(0, str(Path(__file__).with_name("cluster")))
from pytest_emucluster import slurm_cluster  # noqa: E402,F401
