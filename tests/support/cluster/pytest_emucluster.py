"""pytest fixture `slurm_cluster`: one emulated SLURM cluster (emucluster.py) for the whole test session."""

from __future__ import annotations

import pytest

from tests.support.cluster.emucluster import ClusterUnavailable, EmulatedCluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """A started EmulatedCluster (hosts master-node, node01, node02); stopped and removed after the session.

    Fails (not skips) with the reason when it cannot be built: not root, packages missing and not installable,
    no namespaces. Deselect with `-m 'not slurm'` where that is expected.
    """
    cluster = EmulatedCluster()
    try:
        cluster.start()
    except ClusterUnavailable as e:
        pytest.fail(f"emulated SLURM cluster unavailable: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
