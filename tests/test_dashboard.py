"""The Grafana dashboard (``cluster/grafana/ingest.json``) queries what the code exports."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from ingest.distributed.metrics import KINDS, NAMES

DASHBOARD = Path(__file__).parent.parent / "cluster" / "grafana" / "ingest.json"


def problems(dashboard: dict[str, Any]) -> list[str]:
    """What is wrong with ``dashboard``'s queries: a panel without one, a query on a metric
    nothing exports (Ray exports ``<name>`` as ``ray_<name>``), one not filtered by the
    stream, a counter not read as a rate or a gauge read as one, a metric without a panel."""
    out: list[str] = []
    named: set[str] = set()
    for panel in dashboard["panels"]:
        title = panel["title"]
        exprs = [t["expr"] for t in panel.get("targets", [])]
        if not exprs:
            out.append(f"panel {title!r} has no query")
        for expr in exprs:
            found = re.findall(r"\bray_(\w+)", expr)
            if not found:
                out.append(f"panel {title!r}: {expr!r} names no ray_ metric")
            for name in found:
                if name not in NAMES:
                    out.append(f"panel {title!r} queries {name}, which nothing exports")
                    continue
                if f"ray_{name}{{stream" not in expr:
                    out.append(f"panel {title!r}: {name} is not filtered by stream")
                if (f"rate(ray_{name}" in expr) != (KINDS[name] == "counter"):
                    out.append(f"panel {title!r}: {name} is a {KINDS[name]}")
                named.add(name)
    out += [f"no panel shows {name}" for name in sorted(set(NAMES) - named)]
    return out


def test_every_panel_queries_metrics_the_code_exports_and_every_metric_has_a_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert problems(dashboard) == []
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "stream"} <= variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_check_finds_a_metric_nobody_exports_and_one_without_a_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    broken = copy.deepcopy(dashboard)
    target = broken["panels"][0]["targets"][0]
    target["expr"] = target["expr"].replace("ray_ingest_rows_total", "ray_ingest_rowz_total")
    found = problems(broken)
    assert any("ingest_rowz_total, which nothing exports" in p for p in found), found
    assert "no panel shows ingest_rows_total" in found
    gauge = copy.deepcopy(dashboard)
    wait = next(p for p in gauge["panels"] if "wait" in p["title"])
    wait["targets"][0]["expr"] = 'rate(ray_ingest_data_wait_share{stream=~"$stream"}[1m])'
    assert any("ingest_data_wait_share is a gauge" in p for p in problems(gauge))
