"""The job's Ray dashboard over HTTP, with its bearer token: the node list that readiness and `raydist status` read."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request

from raydist.errors import RaydistError

IFACE_LABEL = "raydist.io/interface"
HOST_LABEL = "raydist.io/hostname"


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    hostname: str
    ip: str
    iface: str
    cpus: float
    gpus: float
    alive: bool
    is_head: bool


class DashboardUnavailable(RaydistError):
    """No answer (yet) from the dashboard."""


def parse_nodes(payload: dict) -> list[NodeInfo]:
    """The state API's /api/v0/nodes answer -> nodes; hostnames and interfaces come from raydist's node labels."""
    rows = payload.get("data", {}).get("result", {}).get("result", [])
    out = []
    for r in rows:
        labels = r.get("labels") or {}
        res = r.get("resources_total") or {}
        out.append(
            NodeInfo(
                hostname=labels.get(HOST_LABEL, r.get("node_name", "?")),
                ip=r.get("node_ip", "?"),
                iface=labels.get(IFACE_LABEL, "?"),
                cpus=res.get("CPU", 0.0),
                gpus=res.get("GPU", 0.0),
                alive=r.get("state") == "ALIVE",
                is_head=bool(r.get("is_head_node")),
            )
        )
    return out


def get_json(url: str, token: str | None, timeout: float = 5.0) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode())
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise RaydistError(f"the dashboard at {url.split('/api')[0]} refused the token ({e.code})") from None
        raise DashboardUnavailable(f"dashboard answered {e.code} for {url}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DashboardUnavailable(f"no answer from {url}: {getattr(e, 'reason', e)}") from None


def list_nodes(dashboard_url: str, token: str | None, timeout: float = 5.0) -> list[NodeInfo]:
    return parse_nodes(get_json(f"{dashboard_url}/api/v0/nodes?limit=10000", token, timeout))
