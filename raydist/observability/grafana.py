"""The Grafana dashboard for raydist's metrics (cluster/grafana-raydist.json), generated from ray_metrics.METRICS so
the two never drift apart: `python -m raydist.observability.grafana > cluster/grafana-raydist.json`."""

from __future__ import annotations

import json

from raydist.observability.ray_metrics import EXPORTED_PREFIX, METRICS, Metric

UID = "raydist-training"
_SELECT = 'run=~"$run", strategy=~"$strategy"'
_UNITS = {
    "samples_per_s": "short",
    "step_time_s": "s",
    "checkpoint_s": "s",
    "comm_wait_share": "percentunit",
    "peak_memory_bytes": "bytes",
    "comm_bytes": "Bps",
    "updated_unixtime": "dateTimeAsIso",
    "test_accuracy": "percentunit",
}


def _expr(m: Metric) -> tuple[str, str]:
    """(PromQL, legend) of a metric's panel: a counter as its per-second rate."""
    if m.kind == "counter":
        return f"rate({EXPORTED_PREFIX}{m.name}_total{{{_SELECT}}}[1m])", "{{run}} {{role}} {{rank}} @{{node}}"
    if m.extra_tags == ("worker",):
        return f"{EXPORTED_PREFIX}{m.name}{{{_SELECT}}}", "{{run}} worker {{worker}}"
    return f"{EXPORTED_PREFIX}{m.name}{{{_SELECT}}}", "{{run}} {{role}} {{rank}} @{{node}}"


def _panel(i: int, m: Metric) -> dict:
    expr, legend = _expr(m)
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": m.name + (" (per second)" if m.kind == "counter" else ""),
        "description": m.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": _UNITS.get(m.name, "short")}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {
                "refId": "A",
                "expr": expr,
                "legendFormat": legend,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
            }
        ],
    }


def dashboard() -> dict:
    shown = [m for m in METRICS if m.name != "updated_unixtime"]
    var = lambda name, label: {  # noqa: E731
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": f"label_values({EXPORTED_PREFIX}step, {name})", "refId": name},
        "definition": f"label_values({EXPORTED_PREFIX}step, {name})",
        "includeAll": True,
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
        "sort": 1,
    }
    return {
        "uid": UID,
        "title": "raydist training",
        "tags": ["raydist", "ray"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "5s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                var("run", "run"),
                var("strategy", "strategy"),
            ]
        },
        "panels": [_panel(i, m) for i, m in enumerate(shown)],
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=1) + "\n"


if __name__ == "__main__":
    print(dashboard_json(), end="")
