"""What a run shows: the console (progress bar, quiet Ray logs), metrics.jsonl, the metrics every process exports
through `ray.util.metrics`, TensorBoard event files, the Prometheus scrape config, the Grafana dashboard and
`raydist top`. docs/observability.md.
"""
