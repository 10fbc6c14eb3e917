"""Checks the Helm chart with the real tools.

For the default values and each example in helm/examples/: `helm lint`,
`helm template`, every rendered Kubernetes object validated against the
Kubernetes 1.29 schemas (kubernetes-validate, strict: unknown fields fail),
the pod templates inside custom resources (PyTorchJob, JobSet) validated as
Pods, the custom resources' key fields checked, and the sidecar invariants
checked on every pod template. Values the schema must refuse are refused.
The Grafana dashboard must load and query only metrics docs/METRICS.md
lists (the Python e2e tests check that list against a real scrape).

helm comes from $HELM or PATH (tests/run_all.sh installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "shardfeed"
EXAMPLES = sorted((HERE / "examples").glob("*.yaml"))
REPO = HERE.parent
KUBERNETES = "1.29.0"
# Kinds whose schemas kubernetes-validate has; the rest are custom resources.
CUSTOM = {"PodMonitor", "PyTorchJob", "JobSet"}

Doc = dict[str, Any]


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def helm() -> str:
    found = os.environ.get("HELM") or shutil.which("helm")
    if not found:
        raise CheckFailed("helm not found: set HELM or put it on PATH (tests/run_all.sh installs it)")
    return found


def render(values: Path | None, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", "test", str(CHART)]
    if values is not None:
        args += ["-f", str(values)]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True)


def pod_templates(doc: Doc) -> list[tuple[str, Doc]]:
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Job":
        return [("Job", spec["template"])]
    if kind == "PyTorchJob":
        replicas = spec["pytorchReplicaSpecs"]
        check("Master" in replicas, "PyTorchJob without a Master")
        return [(f"PyTorchJob {name}", r["template"]) for name, r in replicas.items()]
    if kind == "JobSet":
        return [
            (f"JobSet {job['name']}", job["template"]["spec"]["template"])
            for job in spec["replicatedJobs"]
        ]
    return []


def gibibytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+)(Gi|Ti)", quantity)
    check(match is not None, f"unexpected size {quantity!r}")
    assert match is not None
    return int(match.group(1)) * (1024 if match.group(2) == "Ti" else 1)


def env_of(container: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def check_pod(where: str, template: Doc) -> None:
    spec = template["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    sidecars = [c for c in spec.get("initContainers", []) if c["name"] == "shardfeed"]
    check(len(sidecars) == 1, f"{where}: no shardfeed init container")
    sidecar = sidecars[0]
    check(sidecar.get("restartPolicy") == "Always", f"{where}: sidecar is not native")
    for probe in ("startupProbe", "readinessProbe"):
        check(probe in sidecar, f"{where}: sidecar has no {probe}")
    security = sidecar.get("securityContext", {})
    check(security.get("runAsNonRoot") is True, f"{where}: sidecar may run as root")
    check(security.get("readOnlyRootFilesystem") is True, f"{where}: sidecar root fs writable")
    check(security.get("allowPrivilegeEscalation") is False, f"{where}: privilege escalation")
    check(
        security.get("capabilities", {}).get("drop") == ["ALL"],
        f"{where}: sidecar keeps capabilities",
    )
    sidecar_env = env_of(sidecar)
    listen = sidecar_env["SHARDFEED_LISTEN"]
    check(listen.startswith("unix:"), f"{where}: sidecar listens on {listen}")
    socket_dir = os.path.dirname(listen.removeprefix("unix:"))
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    volume = mounts.get(socket_dir)
    check(volume is not None, f"{where}: the socket directory is not a volume")
    trainers = spec["containers"]
    check(len(trainers) == 1, f"{where}: expected one trainer container")
    trainer = trainers[0]
    trainer_mounts = {m["name"]: m["mountPath"] for m in trainer.get("volumeMounts", [])}
    check(trainer_mounts.get(volume) == socket_dir, f"{where}: trainer does not share the socket")
    check(
        env_of(trainer).get("SHARDFEED_TARGET") == "unix://" + listen.removeprefix("unix:"),
        f"{where}: SHARDFEED_TARGET does not name the sidecar's socket",
    )
    memory_limit = next(
        (e.get("valueFrom", {}) for e in sidecar.get("env", []) if e["name"] == "SHARDFEED_MEMORY_LIMIT"),
        {},
    )
    check(
        memory_limit.get("resourceFieldRef", {}).get("resource") == "limits.memory"
        and memory_limit["resourceFieldRef"].get("containerName") == sidecar["name"],
        f"{where}: the sidecar's memory limit does not come from the Downward API",
    )
    grace = int(sidecar_env["SHARDFEED_SHUTDOWN_GRACE"])
    check(
        spec.get("terminationGracePeriodSeconds", 30) > grace,
        f"{where}: the pod's grace period does not cover the drain",
    )
    if "SHARDFEED_CACHE_DIR" in sidecar_env:
        cache_size = gibibytes(sidecar_env["SHARDFEED_CACHE_SIZE"])
        cache_volume = mounts.get(sidecar_env["SHARDFEED_CACHE_DIR"])
        check(cache_volume is not None, f"{where}: the cache directory is not a volume")
        source = next(v for v in spec["volumes"] if v["name"] == cache_volume)
        if "emptyDir" in source:
            limit = source["emptyDir"].get("sizeLimit")
            check(limit is not None, f"{where}: the cache emptyDir has no size limit")
        else:
            claim = source["ephemeral"]["volumeClaimTemplate"]["spec"]
            limit = claim["resources"]["requests"]["storage"]
        check(
            gibibytes(limit) >= cache_size * 1.05,
            f"{where}: cache volume {limit} leaves no headroom over --cache-size {cache_size}Gi",
        )


def check_custom(doc: Doc, pod_labels: Doc) -> None:
    kind = doc["kind"]
    if kind == "PodMonitor":
        selector = doc["spec"]["selector"]["matchLabels"]
        check(
            all(pod_labels.get(k) == v for k, v in selector.items()),
            "PodMonitor selects no pod of the chart",
        )
        ports = [e["port"] for e in doc["spec"]["podMetricsEndpoints"]]
        check(ports == ["metrics"], f"PodMonitor scrapes {ports}")
    elif kind == "PyTorchJob":
        check(doc["apiVersion"] == "kubeflow.org/v1", "PyTorchJob apiVersion")
        for _, template in pod_templates(doc):
            names = [c["name"] for c in template["spec"]["containers"]]
            check(names == ["pytorch"], f"PyTorchJob containers {names}: must be pytorch")
    elif kind == "JobSet":
        check(doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2", "JobSet apiVersion")


def check_scenario(values: Path | None) -> list[str]:
    name = values.name if values else "default values"
    lint = [helm(), "lint", str(CHART)] + (["-f", str(values)] if values else [])
    subprocess.run(lint, check=True, capture_output=True, text=True)
    rendered = render(values)
    check(rendered.returncode == 0, f"{name}: helm template failed: {rendered.stderr}")
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    workloads = [d for d in docs if pod_templates(d)]
    check(len(workloads) == 1, f"{name}: expected one workload, got {len(workloads)}")
    pod_labels = pod_templates(workloads[0])[0][1]["metadata"]["labels"]
    for doc in docs:
        if doc["kind"] not in CUSTOM:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        else:
            check_custom(doc, pod_labels)
        for where, template in pod_templates(doc):
            check_pod(f"{name}: {where}", template)
        if doc["kind"] == "ConfigMap" and "shardfeed.json" in doc.get("data", {}):
            shipped = json.loads(doc["data"]["shardfeed.json"])
            check(shipped == dashboard(), f"{name}: the ConfigMap's dashboard differs")
    return sorted(d["kind"] for d in docs)


def check_refusals() -> None:
    for bad in (
        "workloadKind=Deployment",
        "shardfeed.cache.headroomPercent=1",
        "shardfeed.partSize=1024",
        "shardfeed.allow[0]=http://elsewhere/",
        "unknownValue=1",
    ):
        check(render(None, bad).returncode != 0, f"the schema accepts {bad}")


def dashboard() -> Doc:
    loaded: Doc = json.loads((CHART / "dashboards" / "shardfeed.json").read_text())
    return loaded


def check_dashboard() -> int:
    board = dashboard()
    documented = set(
        re.findall(r"^\| `(shardfeed_[a-z0-9_]+)`", (REPO / "docs/METRICS.md").read_text(), re.M)
    )
    check(board.get("title") and board.get("uid"), "dashboard without title or uid")
    panels = board["panels"]
    check(len(panels) > 0, "dashboard without panels")
    for panel in panels:
        check(bool(panel.get("targets")), f"panel {panel['title']!r} has no query")
        for target in panel["targets"]:
            for metric in re.findall(r"shardfeed_[a-z0-9_]+", target["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", metric)
                check(
                    base in documented,
                    f"panel {panel['title']!r} queries {metric}, which shardfeed does not export",
                )
    return len(panels)


def main() -> int:
    try:
        for values in [None, *EXAMPLES]:
            kinds = check_scenario(values)
            print(f"{values.name if values else 'default values'}: valid, {kinds}")
        check_refusals()
        print(f"dashboard: {check_dashboard()} panels, every metric documented")
    except (CheckFailed, kubernetes_validate.ValidationError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stdout", "") or ""
        print(f"chart check failed: {e}\n{detail}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
