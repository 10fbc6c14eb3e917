"""The Grafana dashboard and the PrometheusRule: every query parses as PromQL
and names only metrics docs/METRICS.md lists; promtool runs the alerts'
tests."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import promql_parser
import yaml

from ._kit import CHART, IMAGE, REPO, CheckFailed, Doc, check, documents, render, run, tool


def dashboard() -> Doc:
    loaded: Doc = json.loads((CHART / "dashboards" / "shardfeed.json").read_text())
    return loaded


def documented_metrics() -> set[str]:
    return set(
        re.findall(r"^\| `(shardfeed_[a-z0-9_]+)`", (REPO / "docs/METRICS.md").read_text(), re.M)
    )


def check_query(expr: str, where: str) -> None:
    """PromQL that parses, over documented metrics and label values."""
    # Grafana's variables, as Grafana substitutes them.
    concrete = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    concrete = re.sub(r"\$\w+", ".*", concrete)
    try:
        promql_parser.parse(concrete)
    except Exception as e:  # the parser raises plain exceptions
        raise CheckFailed(f"{where}: PromQL does not parse: {e}: {expr}") from e
    documented = documented_metrics()
    for metric in re.findall(r"shardfeed_[a-z0-9_]+", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", metric)
        check(base in documented, f"{where} queries {metric}, which shardfeed does not export")
    reference = (REPO / "docs/METRICS.md").read_text() + (
        REPO / "proto/shardfeed/v1/shardfeed.proto"
    ).read_text()
    # Exclusions too: `code!="Ok"` against an exporter that writes `OK`
    # matches every series.
    for label, value in re.findall(r'(\w+)!?="([^"$.*]+)"', expr):
        check(
            re.search(rf"`{re.escape(value)}`|\b{re.escape(value)}\b", reference) is not None,
            f"{where}: {label}={value!r} is no value shardfeed exports",
        )


def check_dashboard() -> int:
    board = dashboard()
    check(board.get("title") and board.get("uid"), "dashboard without title or uid")
    variables = [v["name"] for v in board["templating"]["list"]]
    for needed in ("job", "namespace", "release", "workload", "pod"):
        check(needed in variables, f"the dashboard does not filter by {needed}")
    panels = board["panels"]
    check(len(panels) > 0, "dashboard without panels")
    for panel in panels:
        check(bool(panel.get("targets")), f"panel {panel['title']!r} has no query")
        for target in panel["targets"]:
            check_query(target["expr"], f"panel {panel['title']!r}")
            for variable in ("job", "namespace", "release", "workload", "pod"):
                check(
                    f'{variable}=~"${variable}"' in target["expr"],
                    f"panel {panel['title']!r} ignores ${variable}",
                )
    return len(panels)


def check_rules(doc: Doc) -> None:
    rules = [r for group in doc["spec"]["groups"] for r in group["rules"]]
    names = {r["alert"] for r in rules}
    for needed in (
        "ShardfeedTrainerInputBound",
        "ShardfeedSubstitutionsRising",
        "ShardfeedS3Throttled",
        "ShardfeedStreamsRefusedForMemory",
        "ShardfeedCacheDiskFull",
    ):
        check(needed in names, f"PrometheusRule without {needed}")
    for rule in rules:
        check_query(rule["expr"], f"alert {rule['alert']}")
        check(
            rule["labels"]["severity"] in ("warning", "critical"),
            f"alert {rule['alert']}: severity",
        )
        check(rule["annotations"].get("summary"), f"alert {rule['alert']}: no summary")


def check_alerts_with_promtool() -> int:
    """The default PrometheusRule's groups through the real Prometheus rule
    checker and its unit tests (helm/tests/alerts.test.yaml): each alert
    fires on the event it names."""
    promtool = tool("PROMTOOL", "promtool")
    rendered = render(None, IMAGE, "prometheusRule.enabled=true")
    check(rendered.returncode == 0, f"rules: helm template failed: {rendered.stderr}")
    (rule,) = [d for d in documents(rendered.stdout) if d["kind"] == "PrometheusRule"]
    with tempfile.TemporaryDirectory() as folder:
        rules = Path(folder, "rules.yaml")
        rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        tests = Path(folder, "alerts.test.yaml")
        shutil.copy(CHART.parent / "tests" / "alerts.test.yaml", tests)
        for args in (("check", "rules", str(rules)), ("test", "rules", str(tests))):
            done = run(promtool, *args)
            check(done.returncode == 0, f"promtool {args[0]} rules: {done.stdout}{done.stderr}")
    return len(yaml.safe_load((CHART.parent / "tests" / "alerts.test.yaml").read_text())["tests"])
