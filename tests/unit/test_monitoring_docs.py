"""The Grafana dashboard and the scrape config in docs/monitoring/ name only metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from voxcast.metrics import Metrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "monitoring"


def _exported_names() -> set[str]:
    """Every sample name one process exports (histograms: _bucket/_count/_sum; counters: _total)."""
    text = Metrics().exposition().decode()
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    families = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)", text, re.M):
        name, kind = m.groups()  # a labelled family has no samples before its first observation
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("", "_total")}.get(kind, ("",))
        families |= {name + s for s in suffixes}
    # gauges read from an engine appear only once one is attached; their names are in the collector
    engine = {
        "voxcast_streams_active",
        "voxcast_streams_prefilling",
        "voxcast_streams_waiting",
        "voxcast_engine_steps_total",
        "voxcast_engine_step_rows_total",
        "voxcast_load_seconds",
        "voxcast_warmup_seconds",
    }
    return names | families | engine


def test_every_metric_the_dashboard_uses_exists() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(voxcast_[a-z_]+)", e)}
    assert len(exprs) >= 10 and used
    assert used <= _exported_names(), used - _exported_names()


def test_the_scrape_config_is_valid_yaml_with_targets() -> None:
    config = yaml.safe_load((DOCS / "prometheus.yml").read_text())
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets and all(":" in t for t in targets)
