"""deploy/: every metric the Grafana dashboard queries is one a live worker or gateway
exports (histogram suffixes included), the labels its queries and template variables name
are on those series, and the Prometheus config scrapes the ports ``evenserve up`` uses."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from evenserve.cluster.file import parse_cluster
from evenserve.gateway.server import Gateway
from evenserve.metrics import names
from evenserve.runtime.device import parse_device
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker
from evenserve.worker.service import WorkerOptions, WorkerService
from tests.integration.fake_v2 import serving

from .worker_repo import write_repo

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "evenserve-dashboard.json"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and"}
KEYWORDS |= {"or", "unless", "offset", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings, label
    matchers, ranges and label lists are gone, less function names and keywords."""
    e = _STRING.sub('""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = _LABEL_LIST.sub(" ", _RANGE.sub(" ", e))
    found = set()
    for m in _IDENT.finditer(e):
        rest = e[m.end() :].lstrip()
        if rest.startswith("(") or m.group().lower() in KEYWORDS:
            continue  # a function or an operator
        found.add(m.group())
    return found


def selector_labels(expr: str) -> dict[str, set[str]]:
    """``metric{label=...}``: the label names each selector matches on."""
    out: dict[str, set[str]] = {}
    for m in _SELECTOR.finditer(_STRING.sub('""', expr)):
        out.setdefault(m.group(1), set()).update(_MATCHER.findall(m.group(2)))
    return out


def test_the_identifier_regex() -> None:
    e = (
        'histogram_quantile(0.99, sum by (le, model) (rate(a_bucket{model=~"$m"}[5m]) '
        '* on(instance) group_left(device) b{device=~"x"})) / DCGM_X'
    )
    assert metric_names(e) == {"a_bucket", "b", "DCGM_X"}
    assert selector_labels(e) == {"a_bucket": {"model"}, "b": {"device"}}


def _dashboard() -> dict[str, Any]:
    d = json.loads(DASHBOARD.read_text())
    assert isinstance(d, dict)
    return d


def _exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    d = _dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"device", "model"} <= set(variables)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"])
        assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))]
    dcgm = [p for p in d["panels"] if any("DCGM_" in t["expr"] for t in p["targets"])]
    assert len(dcgm) == 1 and "dcgm-exporter" in dcgm[0]["description"]
    assert "on(UUID)" in " ".join(t["expr"] for t in dcgm[0]["targets"])


def _body(x: float) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [x] * 4}]}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path_factory.mktemp("dash"))
    w = BackgroundWorker(
        WorkerService(load_repository(repo, ["em"]), WorkerOptions(device=parse_device("cpu")))
    )
    w.start()
    yield w
    w.stop()


Series = dict[str, list[dict[str, str]]]


def _series(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(dict(s.labels))
    return out


async def _scrape(worker: BackgroundWorker, root: Path) -> Series:
    raw: dict[str, Any] = {
        "gateway": {
            "routing": "round-robin",
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
        },
        "backends": [{"name": "w0", "url": worker.url, "models": ["em"]}],
    }
    g = Gateway(parse_cluster(raw, root))
    async with serving(g) as served, httpx.AsyncClient(base_url=served.url, timeout=60) as c:
        for i in range(6):
            r = await c.post("/v2/models/em/infer", json=_body(float(i)))
            assert r.status_code == 200
        assert (await c.post("/v2/models/nope/infer", json=_body(0.0))).status_code == 404
        gateway_page = (await c.get("/metrics")).text
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as c:
        worker_page = (await c.get("/metrics")).text
    series = _series(gateway_page)
    for name, labels in _series(worker_page).items():
        series.setdefault(name, []).extend(labels)
    return series


@pytest.fixture(scope="module")
def exported(worker: BackgroundWorker, tmp_path_factory: pytest.TempPathFactory) -> Series:
    """Both pages after a few requests (one for a model nobody serves)."""
    return asyncio.run(_scrape(worker, tmp_path_factory.mktemp("gw")))


def test_every_metric_the_dashboard_queries_is_exported(exported: Series) -> None:
    used = set().union(*(metric_names(e) for e in _exprs(_dashboard())))
    ours = {n for n in used if not n.startswith("DCGM_")}  # dcgm-exporter's are external
    assert all(n.startswith("evenserve_") for n in ours), ours
    assert {n for n in ours if n.endswith("_bucket")}  # histograms are queried by bucket
    assert any(n.endswith(("_sum", "_count")) for n in ours)
    assert sorted(ours - set(exported)) == []


def test_the_labels_the_dashboard_names_are_on_those_series(exported: Series) -> None:
    for expr in _exprs(_dashboard()):
        for metric, labels in selector_labels(expr).items():
            if metric.startswith("DCGM_"):
                continue
            have = set().union(*(s.keys() for s in exported[metric]))
            assert labels <= have, (metric, labels - have)
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    for name in ("device", "model"):
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variables[name]["query"]["query"])
        assert m is not None, variables[name]
        metric, label = m.groups()
        assert exported[metric] and all(label in s for s in exported[metric]), (metric, label)
    # the DCGM join: the info metric carries dcgm-exporter's labels (empty on the CPU)
    (info,) = exported[names.DEVICE_INFO]
    assert {"device", *names.DCGM_LABELS} <= set(info)
    assert info["modelName"] == "cpu" and info["UUID"] == ""


def test_the_prometheus_config_scrapes_what_evenserve_up_starts() -> None:
    cfg = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"evenserve-gateway", "evenserve-workers", "dcgm"}

    def targets(job: str) -> list[str]:
        return [t for sc in jobs[job]["static_configs"] for t in sc["targets"]]

    seed = parse_cluster(
        yaml.safe_load((DEPLOY.parent / "examples" / "cluster-seed.yaml").read_text()),
        DEPLOY.parent / "examples",
    ).config
    assert targets("evenserve-gateway") == [f"127.0.0.1:{seed.gateway.port}"]
    assert seed.workers is not None
    want = [f"127.0.0.1:{seed.workers.port_of(i)}" for i in range(len(seed.workers.devices))]
    assert targets("evenserve-workers") == want
    assert targets("dcgm") == ["127.0.0.1:9400"]
    assert all(j.get("metrics_path", "/metrics") == "/metrics" for j in jobs.values())
