"""What every chart check uses: the paths, the tools (helm, kubectl),
rendering, and the pod templates inside each kind of workload."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

# The helm/ folder, above this package.
HERE = Path(__file__).resolve().parents[1]
CHART = HERE / "shardfeed"
LIBRARY = CHART / "charts" / "shardfeed-sidecar"
EXAMPLES = sorted((HERE / "examples").glob("*.yaml"))
OWN_CHART = HERE / "examples" / "own-chart"
KUSTOMIZE = HERE / "kustomize"
REPO = HERE.parent
KUBERNETES = "1.29.0"
# Kinds whose schemas kubernetes-validate has not; the rest are checked by it.
CUSTOM = {
    "PodMonitor",
    "PrometheusRule",
    "PyTorchJob",
    "JobSet",
    "TrainingRuntime",
    "ClusterTrainingRuntime",
    "ScaledObject",
}
# The one value the chart requires.
IMAGE = "shardfeed.image.repository=registry.example.com/infra/shardfeed"
# The Kustomize component's image until the user's `images:` names theirs:
# the .invalid top-level domain never resolves, so nothing is ever pulled.
PLACEHOLDER_IMAGE = "registry.invalid/shardfeed"

Doc = dict[str, Any]


class CheckFailed(Exception):
    pass


def check(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def tool(variable: str, name: str) -> str:
    found = os.environ.get(variable) or shutil.which(name)
    if not found:
        raise CheckFailed(
            f"{name} not found: set {variable} or put it on PATH (tests/run_all.sh installs it)"
        )
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True)


def render(
    values: Path | None, *sets: str, chart: Path = CHART
) -> subprocess.CompletedProcess[str]:
    args = [tool("HELM", "helm"), "template", "test", str(chart)]
    if values is not None:
        args += ["-f", str(values)]
    for item in sets:
        args += ["--set", item]
    return run(*args)


def documents(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


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
    if kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        return [
            (f"{kind} {job['name']}", job["template"]["spec"]["template"])
            for job in spec["template"]["spec"]["replicatedJobs"]
        ]
    return []


def gibibytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+)(Gi|Ti)", quantity)
    check(match is not None, f"unexpected size {quantity!r}")
    assert match is not None
    return int(match.group(1)) * (1024 if match.group(2) == "Ti" else 1)


def env_of(container: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def trainer_of(spec: Doc) -> Doc:
    """The trainer: the pod's one container, or the Kubeflow Trainer's `node`."""
    containers = spec["containers"]
    named = [c for c in containers if c["name"] == "node"]
    check(len(containers) == 1 or named, f"expected one trainer container, got {len(containers)}")
    trainer: Doc = named[0] if named else containers[0]
    return trainer
