"""Checks the Helm chart, its library and the Kustomize component with the real tools.

For each example in helm/examples/ (and the chart with only the required
value set): `helm lint`, `helm template`, every rendered Kubernetes object
validated against the Kubernetes 1.29 schemas (kubernetes-validate, strict:
unknown fields fail), the pod templates inside custom resources (PyTorchJob,
JobSet, TrainingRuntime) validated as Pods, the sidecar invariants checked on
every pod template, each multi-node example checked to form one training
world (torchrun's node count and rendezvous endpoint resolve to the pods the
workload runs, under a headless Service), the platform's passthrough fields
checked to arrive. Values the schemas must refuse are refused, and a missing
image fails with a message. The library chart is included from a chart of
one's own (helm/examples/own-chart). The Kustomize component, generated from
the library (`--write` regenerates it), is applied with kubectl's kustomize
to a plain Job, a JobSet, a PyTorchJob and a TrainingRuntime. The Grafana
dashboard and the PrometheusRule must query only metrics docs/METRICS.md
lists (the Python e2e tests check that list against a real scrape), in
PromQL that parses.

helm and kubectl come from $HELM / $KUBECTL or PATH (tests/run_all.sh
installs both).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import kubernetes_validate
from chart_checks._kit import EXAMPLES, REPO, CheckFailed
from chart_checks.kustomize import check_kustomize, component_files
from chart_checks.monitoring import check_alerts_with_promtool, check_dashboard
from chart_checks.scenarios import check_own_chart, check_refusals, check_scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help="regenerate the Kustomize component from the library"
    )
    if parser.parse_args().write:
        for path, text in component_files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    try:
        for values in [None, *EXAMPLES]:
            name = values.name if values else "required values only"
            print(f"{name}: valid, {check_scenario(values)}")
        check_refusals()
        print(f"own chart: {check_own_chart()}")
        print(f"kustomize: {check_kustomize()}")
        panels = check_dashboard()
        print(f"dashboard: {panels} panels, every query parses, every metric is documented")
        print(f"alerts: promtool checks the rules and passes {check_alerts_with_promtool()} tests")
    except (CheckFailed, kubernetes_validate.ValidationError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or getattr(e, "stdout", "") or ""
        print(f"chart check failed: {e}\n{detail}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
