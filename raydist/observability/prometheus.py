"""A Prometheus scrape config for a raydist cluster, for Debian's `prometheus` (works offline, unlike
`ray metrics launch-prometheus`, which downloads Prometheus and assumes /tmp/ray).

The targets are every node's Ray metrics endpoint. Prometheus learns them from the head's dashboard
(`/api/prometheus/sd`, HTTP service discovery, with the cluster's token) or, for a Ray instance on the same machine,
from the discovery file its session writes; nodes that join or die later are followed either way.
"""

from __future__ import annotations

import json

SCRAPE_INTERVAL_S = 5


def scrape_config(
    *,
    dashboard_url: str | None = None,
    token_file: str | None = None,
    sd_file: str | None = None,
    job: str = "raydist",
    interval_s: float = SCRAPE_INTERVAL_S,
    refresh_s: float = 30,
) -> str:
    """prometheus.yml text (JSON is YAML: every value quoted safely). Exactly one of dashboard_url / sd_file;
    refresh_s: how often Prometheus asks for the list of nodes again."""
    if (dashboard_url is None) == (sd_file is None):
        raise ValueError("give a dashboard URL or a service-discovery file")
    if dashboard_url is not None:
        sd: dict = {"url": f"{dashboard_url.rstrip('/')}/api/prometheus/sd", "refresh_interval": f"{refresh_s:g}s"}
        if token_file:
            sd["authorization"] = {"type": "Bearer", "credentials_file": token_file}
        discovery = {"http_sd_configs": [sd]}
    else:
        discovery = {"file_sd_configs": [{"files": [sd_file], "refresh_interval": f"{refresh_s:g}s"}]}
    config = {
        "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
        "scrape_configs": [{"job_name": job, **discovery}],
    }
    return (
        "# Prometheus config for a raydist cluster (written by `raydist prometheus-config`)\n"
        + json.dumps(config, indent=2)
        + "\n"
    )
