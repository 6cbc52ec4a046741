"""``VOXCAST_METRICS_PORT``: the RQ worker and the RunPod queue handler answer ``/metrics`` on a port of
their own (the HTTP server answers it on its API port)."""

from __future__ import annotations

from collections.abc import Mapping

from voxcast.envvars import env_int
from voxcast.metrics import Metrics

__all__ = ["serve_metrics"]


def serve_metrics(env: Mapping[str, str]) -> Metrics:
    """The process's metrics, served on ``VOXCAST_METRICS_PORT`` when it is set (before the model
    loads, so a scrape sees ``voxcast_engine_state{state="loading"}``).

    Raises:
        ValueError: a port that does not parse. OSError: a port that is taken.
    """
    metrics = Metrics()
    port = env_int(env, "VOXCAST_METRICS_PORT", 0, lo=0, hi=65535)
    if port:
        metrics.serve(port, host=env.get("VOXCAST_METRICS_HOST", "").strip() or "0.0.0.0")
    return metrics
