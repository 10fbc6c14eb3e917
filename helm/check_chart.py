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
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import yaml

HERE = Path(__file__).resolve().parent
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


def check_pod(where: str, template: Doc) -> None:
    spec = template["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    init = spec.get("initContainers", [])
    sidecars = [c for c in init if c["name"] == "shardfeed"]
    check(len(sidecars) == 1, f"{where}: no shardfeed init container")
    sidecar = sidecars[0]
    check(sidecar.get("restartPolicy") == "Always", f"{where}: sidecar is not native")
    check("registry.invalid" not in sidecar["image"], f"{where}: the placeholder image is left")
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
    trainer = trainer_of(spec)
    trainer_mounts = {m["name"]: m["mountPath"] for m in trainer.get("volumeMounts", [])}
    check(trainer_mounts.get(volume) == socket_dir, f"{where}: trainer does not share the socket")
    check(
        env_of(trainer).get("SHARDFEED_TARGET") == "unix://" + listen.removeprefix("unix:"),
        f"{where}: SHARDFEED_TARGET does not name the sidecar's socket",
    )
    downward: dict[str, Doc] = {
        e["name"]: e.get("valueFrom", {}).get("resourceFieldRef", {})
        for e in sidecar.get("env", [])
    }
    for variable, resource, divisor in (
        ("SHARDFEED_MEMORY_LIMIT", "limits.memory", None),
        ("SHARDFEED_CPU_REQUEST_MILLICORES", "requests.cpu", "1m"),
    ):
        field = downward.get(variable, {})
        check(
            field.get("resource") == resource
            and field.get("containerName") == sidecar["name"]
            and field.get("divisor") == divisor,
            f"{where}: the sidecar's {resource} does not reach {variable} from the Downward API"
            + (f" (divisor {divisor})" if divisor else ""),
        )
    check(
        "memory" in sidecar.get("resources", {}).get("limits", {}),
        f"{where}: the sidecar has no memory limit for the Downward API to pass",
    )
    grace = int(sidecar_env["SHARDFEED_SHUTDOWN_GRACE"])
    check(
        spec.get("terminationGracePeriodSeconds", 30) > grace,
        f"{where}: the pod's grace period does not cover the drain",
    )
    if "SHARDFEED_CACHE_DIR" in sidecar_env:
        check_cache(where, spec, sidecar, mounts)


def check_cache(where: str, spec: Doc, sidecar: Doc, mounts: dict[str, str]) -> None:
    sidecar_env = env_of(sidecar)
    cache_dir = sidecar_env["SHARDFEED_CACHE_DIR"]
    cache_size = gibibytes(sidecar_env["SHARDFEED_CACHE_SIZE"])
    decoded_dir = sidecar_env.get("SHARDFEED_DECODED_CACHE_DIR")
    if decoded_dir is not None:
        # The tier shares the cache's volume, in a directory of its own.
        check(
            decoded_dir.startswith(cache_dir.rstrip("/") + "/"),
            f"{where}: the decoded-source tier {decoded_dir} is not in the cache's volume",
        )
        cache_size += gibibytes(sidecar_env["SHARDFEED_DECODED_CACHE_SIZE"])
    cache_volume = mounts.get(cache_dir)
    check(cache_volume is not None, f"{where}: the cache directory is not a volume")
    source = next(v for v in spec["volumes"] if v["name"] == cache_volume)
    if "hostPath" in source or "persistentVolumeClaim" in source:
        # Outlives the pod: sidecars side by side take slots, a replacement waits.
        check(
            int(sidecar_env.get("SHARDFEED_CACHE_SLOTS", "0")) >= 1,
            f"{where}: a shared cache without slots",
        )
        check(
            "SHARDFEED_CACHE_LOCK_WAIT" in sidecar_env,
            f"{where}: a shared cache without a lock wait",
        )
        if "hostPath" in source:
            check(source["hostPath"].get("type") == "DirectoryOrCreate", f"{where}: hostPath type")
            init = spec["initContainers"]
            owners = [c for c in init if c["name"] == "shardfeed-cache-owner"]
            if owners:
                owner = owners[0]
                check(
                    init.index(owner) < init.index(sidecar),
                    f"{where}: the cache is prepared after the sidecar starts",
                )
                caps = owner["securityContext"]["capabilities"]
                check(
                    caps == {"drop": ["ALL"], "add": ["CHOWN"]},
                    f"{where}: the preparer's capabilities {caps}",
                )
                check(
                    owner["args"][:3]
                    == [
                        "prepare-cache-dir",
                        "--owner",
                        f"{sidecar['securityContext']['runAsUser']}:{sidecar['securityContext']['runAsGroup']}",
                    ]
                    and owner["args"][3] == cache_dir,
                    f"{where}: the preparer does not give {cache_dir} to the sidecar's user",
                )
        return
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


def expand(text: str, env: dict[str, str]) -> str:
    """$(VAR) as Kubernetes expands it in command and args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def torchrun_flags(container: Doc) -> dict[str, str]:
    env = env_of(container)
    words = [expand(w, env) for w in container.get("command", []) + container.get("args", [])]
    check(words and words[0] == "torchrun", f"the trainer does not run torchrun: {words}")
    return dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)


def check_world(docs: list[Doc], name: str) -> str:
    """One training world: torchrun's rendezvous reaches the first pod and
    counts every pod the workload runs."""
    workload = next(d for d in docs if pod_templates(d))
    kind, spec = workload["kind"], workload["spec"]
    template = pod_templates(workload)[0][1]
    trainer = trainer_of(template["spec"])
    if kind in ("PyTorchJob", "TrainingRuntime", "ClusterTrainingRuntime"):
        flags = torchrun_flags(trainer)
        for flag in ("nnodes", "node-rank", "rdzv-endpoint", "master-addr"):
            check(flag not in flags, f"{name}: --{flag} overrides the {kind} operator's world")
        check(
            not {"MASTER_ADDR", "NNODES"} & set(env_of(trainer)),
            f"{name}: the operator's env overridden",
        )
        check(not trainer.get("ports"), f"{name}: a rendezvous port beside the operator's")
        if kind == "PyTorchJob":
            check(spec.get("nprocPerNode"), f"{name}: PyTorchJob without nprocPerNode")
            pods = 1 + spec["pytorchReplicaSpecs"].get("Worker", {}).get("replicas", 0)
        else:
            torch = spec["mlPolicy"]["torch"]
            check(torch.get("numProcPerNode"), f"{name}: {kind} without numProcPerNode")
            pods = spec["mlPolicy"]["numNodes"]
        return f"one world of {pods} pods (the operator's env)"
    name_ = workload["metadata"]["name"]
    if kind == "Job":
        pods = spec["parallelism"]
        if pods == 1:
            return "one pod"
        check(
            spec["completions"] == pods and spec["completionMode"] == "Indexed",
            f"{name}: not one indexed world",
        )
        services = [
            d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"
        ]
        check(len(services) == 1, f"{name}: a multi-pod Job without a headless Service")
        service = services[0]
        labels = template["metadata"]["labels"]
        check(
            all(labels.get(k) == v for k, v in service["spec"]["selector"].items()),
            f"{name}: the headless Service selects no pod",
        )
        check(
            service["spec"].get("publishNotReadyAddresses") is True,
            f"{name}: DNS waits for readiness",
        )
        subdomain = template["spec"].get("subdomain")
        check(
            subdomain == service["metadata"]["name"],
            f"{name}: pods are not under the Service's subdomain",
        )
        first_pod = f"{name_}-0.{subdomain}"
    else:
        check(kind == "JobSet", f"{name}: unexpected workload {kind}")
        jobs = spec["replicatedJobs"]
        pods = sum(j.get("replicas", 1) * j["template"]["spec"]["parallelism"] for j in jobs)
        network = spec.get("network", {})
        check(network.get("enableDNSHostnames") is True, f"{name}: JobSet pods have no DNS names")
        check(network.get("publishNotReadyAddresses") is True, f"{name}: DNS waits for readiness")
        first_pod = f"{name_}-{jobs[0]['name']}-0-0.{network.get('subdomain', name_)}"
    flags = torchrun_flags(trainer)
    ports = {p["name"]: p["containerPort"] for p in trainer.get("ports", [])}
    check(
        flags.get("nnodes") == str(pods), f"{name}: --nnodes={flags.get('nnodes')} for {pods} pods"
    )
    check(
        flags.get("node-rank") == "$(JOB_COMPLETION_INDEX)",
        f"{name}: --node-rank is not the pod's index",
    )
    check(
        flags.get("rdzv-backend") == "c10d",
        f"{name}: rendezvous backend {flags.get('rdzv-backend')}",
    )
    endpoint = f"{first_pod}:{ports.get('rendezvous')}"
    check(
        flags.get("rdzv-endpoint") == endpoint,
        f"{name}: --rdzv-endpoint={flags.get('rdzv-endpoint')}, not {endpoint}",
    )
    return f"one world of {pods} pods, rendezvous at {endpoint}"


def check_passthrough(docs: list[Doc], values: Doc, name: str) -> None:
    """What platforms set on every workload arrives where Kubernetes reads it."""
    workload = next(d for d in docs if pod_templates(d))
    for key, value in values.get("workloadLabels", {}).items():
        check(
            workload["metadata"]["labels"].get(key) == value, f"{name}: workload label {key} lost"
        )
    for key, value in values.get("workloadAnnotations", {}).items():
        check(
            workload["metadata"].get("annotations", {}).get(key) == value,
            f"{name}: annotation {key} lost",
        )
    # Failure handling the platform asked for, where each kind reads it.
    kind, spec = workload["kind"], workload["spec"]
    wanted: list[tuple[str, Any, Any]] = []
    if kind == "Job":
        for field in ("activeDeadlineSeconds", "podFailurePolicy"):
            wanted.append((f"job.{field}", values.get("job", {}).get(field), spec.get(field)))
    elif kind == "JobSet":
        jobset = values.get("jobSet", {})
        wanted.append(
            ("jobSet.failurePolicy", jobset.get("failurePolicy"), spec.get("failurePolicy"))
        )
        for job in spec["replicatedJobs"]:
            for field in ("activeDeadlineSeconds", "podFailurePolicy"):
                wanted.append(
                    (f"jobSet.{field}", jobset.get(field), job["template"]["spec"].get(field))
                )
    elif kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        policy = values.get("trainingRuntime", {}).get("failurePolicy")
        wanted.append(
            ("trainingRuntime.failurePolicy", policy, spec["template"]["spec"].get("failurePolicy"))
        )
    for key, value, rendered in wanted:
        if value is not None:
            check(rendered == value, f"{name}: {key} not passed through ({rendered!r})")
    decoded = values.get("shardfeed", {}).get("cache", {}).get("decoded", {})
    for where, template in pod_templates(workload):
        spec = template["spec"]
        if decoded.get("enabled"):
            sidecar = next(c for c in spec["initContainers"] if c["name"] == "shardfeed")
            check(
                env_of(sidecar).get("SHARDFEED_DECODED_CACHE_SIZE") == f"{decoded['sizeGi']}Gi",
                f"{name}: {where}: the decoded-source tier's size is not passed through",
            )
        for field in (
            "imagePullSecrets",
            "priorityClassName",
            "schedulerName",
            "nodeSelector",
            "tolerations",
            "affinity",
        ):
            if values.get(field):
                check(
                    spec.get(field) == values[field], f"{name}: {where}: {field} not passed through"
                )
        shm = values.get("trainer", {}).get("shmSize")
        if shm:
            volume = next(
                (
                    v
                    for v in spec["volumes"]
                    if v.get("emptyDir", {}).get("medium") == "Memory"
                    and v["emptyDir"].get("sizeLimit") == shm
                ),
                None,
            )
            check(volume is not None, f"{name}: {where}: no {shm} memory volume for /dev/shm")
            assert volume is not None
            mounts = {m["mountPath"]: m["name"] for m in trainer_of(spec).get("volumeMounts", [])}
            check(
                mounts.get("/dev/shm") == volume["name"],
                f"{name}: {where}: /dev/shm is not the memory volume",
            )


def check_documents(docs: list[Doc], name: str) -> None:
    workloads = [d for d in docs if pod_templates(d)]
    check(len(workloads) == 1, f"{name}: expected one workload, got {len(workloads)}")
    pod_labels = pod_templates(workloads[0])[0][1].get("metadata", {}).get("labels", {})
    # The decode pool's workers, where on: a PodMonitor of theirs selects them.
    pool_labels = [
        d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"
    ]
    for doc in docs:
        if doc["kind"] not in CUSTOM:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        elif doc["kind"] == "PodMonitor" and doc["metadata"]["name"].endswith("-pool"):
            check_custom(doc, pool_labels[0] if pool_labels else {})
        else:
            check_custom(doc, pod_labels)
        for where, template in pod_templates(doc):
            check_pod(f"{name}: {where}", template)
            # Metrics leave loopback only where a PodMonitor scrapes them.
            scraped = any(d["kind"] == "PodMonitor" for d in docs)
            sidecars = [
                c for c in template["spec"].get("initContainers", []) if c["name"] == "shardfeed"
            ]
            for sidecar in sidecars:
                listen = env_of(sidecar)["SHARDFEED_METRICS_LISTEN"]
                check(
                    listen.startswith("0.0.0.0:" if scraped else "127.0.0.1:"),
                    f"{name}: metrics on {listen} with{'' if scraped else 'out'} a PodMonitor",
                )
        if doc["kind"] == "ConfigMap" and "shardfeed.json" in doc.get("data", {}):
            shipped = json.loads(doc["data"]["shardfeed.json"])
            check(shipped == dashboard(), f"{name}: the ConfigMap's dashboard differs")


def check_custom(doc: Doc, pod_labels: Doc) -> None:
    kind = doc["kind"]
    if kind == "PodMonitor":
        selector = doc["spec"]["selector"]["matchLabels"]
        check(
            all(pod_labels.get(k) == v for k, v in selector.items()),
            "PodMonitor selects no pod of the chart",
        )
        endpoints = doc["spec"]["podMetricsEndpoints"]
        check([e["port"] for e in endpoints] == ["metrics"], "PodMonitor scrapes another port")
        targets = {r["targetLabel"] for r in endpoints[0].get("relabelings", [])}
        check(
            {"release", "workload"} <= targets,
            f"PodMonitor adds {targets}, the dashboard filters by release and workload",
        )
    elif kind == "PrometheusRule":
        check_rules(doc)
    elif kind == "PyTorchJob":
        check(doc["apiVersion"] == "kubeflow.org/v1", "PyTorchJob apiVersion")
        for _, template in pod_templates(doc):
            names = [c["name"] for c in template["spec"]["containers"]]
            check(names == ["pytorch"], f"PyTorchJob containers {names}: must be pytorch")
    elif kind == "JobSet":
        check(doc["apiVersion"] == "jobset.x-k8s.io/v1alpha2", "JobSet apiVersion")
    elif kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        check(doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1", f"{kind} apiVersion")
        check(
            doc["metadata"]["labels"].get("trainer.kubeflow.org/framework") == "torch",
            f"{kind}: not labelled for the Trainer's torch plugin",
        )
        for job in doc["spec"]["template"]["spec"]["replicatedJobs"]:
            # The Trainer puts the TrainJob's image, command and world into
            # the container named node of the job its ancestor label marks.
            labels = job["template"].get("metadata", {}).get("labels", {})
            check(
                labels.get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer",
                f"{kind} job {job['name']}: no trainer ancestor label",
            )
            names = [c["name"] for c in job["template"]["spec"]["template"]["spec"]["containers"]]
            check(names == ["node"], f"{kind} containers {names}: must be node")


def check_pool(docs: list[Doc], name: str) -> str:
    """The decode pool, where on: sidecars dial its headless Service with
    the token its workers hold; the Service selects the workers and no
    training pod; KEDA scales the Deployment on documented metrics."""
    pools = [d for d in docs if d["kind"] == "Deployment"]
    if not pools:
        return ""
    (pool,) = pools
    worker_labels = pool["spec"]["template"]["metadata"]["labels"]
    (service,) = [
        d
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] == pool["metadata"]["name"]
    ]
    check(service["spec"].get("clusterIP") == "None", f"{name}: the pool's Service is not headless")
    selector = service["spec"]["selector"]
    check(
        all(worker_labels.get(k) == v for k, v in selector.items()),
        f"{name}: the pool's Service does not select its workers",
    )
    (port,) = service["spec"]["ports"]
    worker = pool["spec"]["template"]["spec"]
    secrets = sorted(v["secret"]["secretName"] for v in worker["volumes"] if "secret" in v)
    (container,) = worker["containers"]
    tls = "SHARDFEED_POOL_TLS_CA" in env_of(container)
    check(
        tls or env_of(container).get("SHARDFEED_POOL_INSECURE_PLAINTEXT") == "true",
        f"{name}: the workers have neither TLS nor an explicit plain-text flag",
    )
    health = env_of(container).get("SHARDFEED_POOL_HEALTH_LISTEN", "")
    for probe in ("readinessProbe", "livenessProbe"):
        probed = container[probe]["grpc"]["port"]
        check(
            health.endswith(f":{probed}"),
            f"{name}: the workers' {probe} dials {probed}, not the health port ({health})",
        )
    check_network_policy(docs, pool, port, name)
    for doc in docs:
        for where, template in pod_templates(doc):
            labels = template["metadata"].get("labels", {})
            check(
                not all(labels.get(k) == v for k, v in selector.items()),
                f"{name}: the pool's Service selects {where}'s training pods",
            )
            (sidecar,) = [
                c for c in template["spec"].get("initContainers", []) if c["name"] == "shardfeed"
            ]
            env = env_of(sidecar)
            address = f"{service['metadata']['name']}:{port['port']}"
            check(env.get("SHARDFEED_POOL") == address, f"{name}: {where} dials no {address}")
            mounted = sorted(
                v["secret"]["secretName"] for v in template["spec"]["volumes"] if "secret" in v
            )
            check(mounted == secrets, f"{name}: {where} mounts {mounted}, the workers {secrets}")
            check(
                ("SHARDFEED_POOL_TLS_CA" in env) == tls,
                f"{name}: {where} and the workers disagree on TLS",
            )
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    for doc in scaled:
        check(
            doc["spec"]["scaleTargetRef"]["name"] == pool["metadata"]["name"],
            f"{name}: the ScaledObject scales something else",
        )
        for trigger in doc["spec"]["triggers"]:
            check(trigger["type"] == "prometheus", f"{name}: a {trigger['type']} trigger")
            query = trigger["metadata"]["query"]
            release = 'release="test"'
            check(release in query, f"{name}: KEDA's query ignores the release: {query}")
            # The release's name is the user's, not a value shardfeed exports.
            check_query(query.replace(release, 'release=~"$release"'), f"{name} ScaledObject")
    return f", a decode pool{' scaled by KEDA' if scaled else ''}"


def check_network_policy(docs: list[Doc], pool: Doc, port: Doc, name: str) -> None:
    """Where there is one, the pool's NetworkPolicy selects its workers and
    admits to the gRPC port the training pods, whose labels it names."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if not policies:
        return
    (policy,) = policies
    worker_labels = pool["spec"]["template"]["metadata"]["labels"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    check(
        all(worker_labels.get(k) == v for k, v in selected.items()),
        f"{name}: the NetworkPolicy does not select the workers",
    )
    grpc_rules = [
        rule
        for rule in policy["spec"]["ingress"]
        if any(p["port"] == port["targetPort"] for p in rule.get("ports", []))
    ]
    check(len(grpc_rules) == 1, f"{name}: the gRPC port is in {len(grpc_rules)} rules")
    peers = [peer["podSelector"]["matchLabels"] for peer in grpc_rules[0]["from"]]
    for doc in docs:
        for where, template in pod_templates(doc):
            labels = template["metadata"].get("labels", {})
            check(
                any(all(labels.get(k) == v for k, v in peer.items()) for peer in peers),
                f"{name}: the NetworkPolicy keeps {where}'s training pods from the workers",
            )


def check_scenario(values: Path | None) -> str:
    name = values.name if values else "required values only"
    sets = () if values else (IMAGE,)
    lint = [tool("HELM", "helm"), "lint", str(CHART)] + (
        ["-f", str(values)] if values else ["--set", IMAGE]
    )
    subprocess.run(lint, check=True, capture_output=True, text=True)
    rendered = render(values, *sets)
    check(rendered.returncode == 0, f"{name}: helm template failed: {rendered.stderr}")
    docs = documents(rendered.stdout)
    check_documents(docs, name)
    world = check_world(docs, name)
    if values is not None:
        check_passthrough(docs, yaml.safe_load(values.read_text()), name)
    check_notes(values, sets, docs, name)
    return f"{sorted(d['kind'] for d in docs)}, {world}{check_pool(docs, name)}"


def check_notes(values: Path | None, sets: tuple[str, ...], docs: list[Doc], name: str) -> None:
    """NOTES.txt renders and names what was deployed and how to check it."""
    args = [tool("HELM", "helm"), "install", "test", str(CHART), "--dry-run=client"]
    args += ["-f", str(values)] if values is not None else []
    for item in sets:
        args += ["--set", item]
    installed = run(*args)
    check(installed.returncode == 0, f"{name}: helm install --dry-run failed: {installed.stderr}")
    notes = installed.stdout.partition("\nNOTES:\n")[2]
    workload = next(d for d in docs if pod_templates(d))
    for needed in (
        f"{workload['kind']} {workload['metadata']['name']}",
        "-c shardfeed -- shardfeed health",
        "/metrics",
    ):
        check(needed in notes, f"{name}: NOTES.txt does not say {needed!r}:\n{notes}")
    if any(d["kind"] == "Deployment" for d in docs):
        check("shardfeed_pool_" in notes, f"{name}: NOTES.txt says nothing of the pool")


def check_refusals() -> None:
    missing = render(None)
    check(
        missing.returncode != 0 and "shardfeed.image.repository is not set" in missing.stderr,
        f"rendering without an image does not say so: {missing.stderr}",
    )
    for sets, message in (
        (("job.parallelism=4", "job.completions=8"), "must be equal"),
        (
            ("shardfeed.cache.enabled=true", "shardfeed.cache.volume=persistentVolumeClaim"),
            "claimName is not set",
        ),
        (("shardfeed.cache.decoded.enabled=true",), "needs shardfeed.cache.enabled"),
        (("shardfeed.pool.address=pool:50061",), "pool.tokenSecret is not set"),
        (
            ("shardfeed.pool.address=pool:50061", "shardfeed.pool.tokenSecret=t"),
            "pool.tlsSecret is not set",
        ),
    ):
        refused = render(None, IMAGE, *sets)
        check(
            refused.returncode != 0 and message in refused.stderr,
            f"{sets} is not refused with {message!r}",
        )
    for bad in (
        "workloadKind=Deployment",
        "shardfeed.cache.headroomPercent=1",
        "shardfeed.cache.volume=nfs",
        "shardfeed.cache.slots=0",
        "shardfeed.cache.decoded.sizeGi=0",
        "shardfeed.partSize=1024",
        "shardfeed.allow[0]=http://elsewhere/",
        "shardfeed.pool.share=most",
        "pool.autoscaling.samplesPerSecondPerWorker=0",
        "shardfeed.imagee.tag=1",
        "trainer.shmSize=lots",
        "prometheusRule.for.inputBound=soon",
        "imagePullSecrets[0].nam=x",
        "unknownValue=1",
    ):
        check(render(None, IMAGE, bad).returncode != 0, f"the schema accepts {bad}")


def check_own_chart() -> str:
    """The library included from a chart of one's own, as a team would."""
    with tempfile.TemporaryDirectory() as work:
        chart = Path(work) / OWN_CHART.name
        shutil.copytree(OWN_CHART, chart)
        manifest = chart / "Chart.yaml"
        manifest.write_text(
            manifest.read_text().replace(
                "file://../../shardfeed/charts/shardfeed-sidecar", f"file://{LIBRARY}"
            )
        )
        subprocess.run(
            [tool("HELM", "helm"), "dependency", "build", str(chart)],
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(
            [tool("HELM", "helm"), "lint", str(chart)], check=True, capture_output=True, text=True
        )
        for sets in (
            (),
            ("shardfeed.cache.enabled=true", "shardfeed.cache.volume=hostPath"),
            (
                "shardfeed.cache.enabled=true",
                "shardfeed.cache.volume=hostPath",
                "shardfeed.cache.decoded.enabled=true",
            ),
        ):
            rendered = render(None, *sets, chart=chart)
            check(rendered.returncode == 0, f"own chart: helm template failed: {rendered.stderr}")
            check_documents(documents(rendered.stdout), "own chart")
        unset = render(None, "shardfeed.image.repository=", chart=chart)
        check(
            "shardfeed.image.repository is not set" in unset.stderr,
            "own chart: a missing image renders",
        )
    return "includes the library: valid, with and without a node cache"


# The Kustomize component: which pod templates of which kinds get the
# sidecar, and which container there is the trainer.
KUSTOMIZE_TARGETS = {
    "shardfeed-sidecar": [
        ("Job", "spec.template.spec", "0"),
        ("JobSet", "spec.replicatedJobs.*.template.spec.template.spec", "0"),
        # A PyTorchJob's Workers are another component: a path to a missing
        # Worker would be created, leaving a Worker without containers.
        ("PyTorchJob", "spec.pytorchReplicaSpecs.Master.template.spec", "0"),
        (
            "TrainingRuntime",
            "spec.template.spec.replicatedJobs.[name=node].template.spec.template.spec",
            "[name=node]",
        ),
        (
            "ClusterTrainingRuntime",
            "spec.template.spec.replicatedJobs.[name=node].template.spec.template.spec",
            "[name=node]",
        ),
    ],
    "pytorchjob-workers": [
        ("PyTorchJob", "spec.pytorchReplicaSpecs.Worker.template.spec", "0"),
    ],
}
# (field of the source Pod, the same field in a target, with {trainer}).
KUSTOMIZE_FIELDS = [
    ("spec.initContainers.[name=shardfeed]", "initContainers.[name=shardfeed]"),
    (
        "spec.containers.0.env.[name=SHARDFEED_TARGET]",
        "containers.{trainer}.env.[name=SHARDFEED_TARGET]",
    ),
    (
        "spec.containers.0.volumeMounts.[name=shardfeed-socket]",
        "containers.{trainer}.volumeMounts.[name=shardfeed-socket]",
    ),
    ("spec.volumes.[name=shardfeed-socket]", "volumes.[name=shardfeed-socket]"),
]
GENERATED = "# Generated by helm/check_chart.py --write from the library chart; do not edit.\n"
SOURCE_POD = "shardfeed-sidecar"


def kustomization(component: str) -> str:
    replacements = []
    for source, target in KUSTOMIZE_FIELDS:
        targets = [
            {
                "select": {"kind": kind},
                "fieldPaths": [f"{path}.{target.format(trainer=trainer)}"],
                "options": {"create": True},
            }
            for kind, path, trainer in KUSTOMIZE_TARGETS[component]
        ]
        replacements.append(
            {"source": {"kind": "Pod", "name": SOURCE_POD, "fieldPath": source}, "targets": targets}
        )
    doc: Doc = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component"}
    if component == "shardfeed-sidecar":
        doc["resources"] = ["sidecar.yaml"]
    doc["replacements"] = replacements
    dumped: str = yaml.safe_dump(doc, sort_keys=False, width=200)
    return GENERATED + dumped


SIDECAR_POD = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    # Read by the replacements, never emitted.
    config.kubernetes.io/local-config: "true"
spec:
  initContainers:
    {{{{- include "shardfeed-sidecar.initContainers" .Values.shardfeed | nindent 4 }}}}
  containers:
    - name: trainer
      env:
        {{{{- include "shardfeed-sidecar.trainerEnv" .Values.shardfeed | nindent 8 }}}}
      volumeMounts:
        {{{{- include "shardfeed-sidecar.trainerVolumeMounts" .Values.shardfeed | nindent 8 }}}}
  volumes:
    {{{{- include "shardfeed-sidecar.volumes" .Values.shardfeed | nindent 4 }}}}
"""


def sidecar_pod() -> str:
    """The component's sidecar, rendered from the library: the drain fits the
    default 30 s grace period of the pods it is added to."""
    with tempfile.TemporaryDirectory() as work:
        chart = Path(work) / "component"
        (chart / "templates").mkdir(parents=True)
        (chart / "charts").mkdir()
        shutil.copytree(LIBRARY, chart / "charts" / LIBRARY.name)
        (chart / "Chart.yaml").write_text(
            "apiVersion: v2\nname: component\nversion: 0.0.0\ndependencies:\n"
            f"  - name: {LIBRARY.name}\n    version: {library_version()}\n    alias: shardfeed\n"
        )
        (chart / "templates" / "pod.yaml").write_text(SIDECAR_POD.format(name=SOURCE_POD))
        rendered = render(
            None,
            f"shardfeed.image.repository={PLACEHOLDER_IMAGE}",
            "shardfeed.shutdownGraceSeconds=20",
            chart=chart,
        )
        check(rendered.returncode == 0, f"rendering the component's sidecar: {rendered.stderr}")
    body = "".join(
        line + "\n"
        for line in rendered.stdout.splitlines()
        if line != "---" and not line.startswith("# Source:")
    )
    return GENERATED + body


def library_version() -> str:
    found = re.search(r"^version: (\S+)", (LIBRARY / "Chart.yaml").read_text(), re.M)
    assert found is not None
    return found.group(1)


def component_files() -> dict[Path, str]:
    files = {KUSTOMIZE / "shardfeed-sidecar" / "sidecar.yaml": sidecar_pod()}
    for component in KUSTOMIZE_TARGETS:
        files[KUSTOMIZE / component / "kustomization.yaml"] = kustomization(component)
    return files


# Workloads as teams write them, for the component to patch: other init
# containers, env and mounts that must survive.
KUSTOMIZE_BASE = """
apiVersion: batch/v1
kind: Job
metadata: {name: plain}
spec:
  template:
    spec:
      restartPolicy: Never
      initContainers:
        - {name: fetch-config, image: busybox:1.37, command: ["true"]}
      containers:
        - name: main
          image: registry.example.com/team/trainer:2026.11
          env: [{name: EXISTING, value: "1"}]
---
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: world}
spec:
  replicatedJobs:
    - name: workers
      replicas: 2
      template:
        spec:
          parallelism: 4
          completions: 4
          template:
            spec:
              restartPolicy: Never
              containers:
                - {name: trainer, image: registry.example.com/team/trainer:2026.11}
---
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: operator}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
            - {name: pytorch, image: registry.example.com/team/trainer:2026.11}
    Worker:
      replicas: 3
      template:
        spec:
          containers:
            - {name: pytorch, image: registry.example.com/team/trainer:2026.11}
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: torch-with-shardfeed}
spec:
  mlPolicy: {numNodes: 1, torch: {numProcPerNode: auto}}
  template:
    spec:
      replicatedJobs:
        - name: dataset-initializer
          template:
            spec:
              template:
                spec:
                  containers:
                    - name: dataset-initializer
                      image: ghcr.io/kubeflow/trainer/dataset-initializer
        - name: node
          template:
            spec:
              template:
                spec:
                  containers:
                    - {name: node, image: pytorch/pytorch}
"""


def check_kustomize() -> str:
    for path, text in component_files().items():
        check(
            path.exists() and path.read_text() == text,
            f"{path.relative_to(REPO)} is stale: run python helm/check_chart.py --write",
        )
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        shutil.copytree(KUSTOMIZE, root / "components")
        (root / "base").mkdir()
        (root / "base" / "workloads.yaml").write_text(KUSTOMIZE_BASE)
        (root / "base" / "kustomization.yaml").write_text("resources: [workloads.yaml]\n")
        (root / "overlay").mkdir()
        (root / "overlay" / "kustomization.yaml").write_text(
            "resources: [../base]\n"
            "components: [../components/shardfeed-sidecar, ../components/pytorchjob-workers]\n"
            f"images:\n  - name: {PLACEHOLDER_IMAGE}\n"
            "    newName: registry.example.com/infra/shardfeed\n"
        )
        built = run(tool("KUBECTL", "kubectl"), "kustomize", str(root / "overlay"))
        check(built.returncode == 0, f"kustomize failed: {built.stderr}")
    docs = {d["kind"]: d for d in documents(built.stdout)}
    check(
        set(docs) == {"Job", "JobSet", "PyTorchJob", "ClusterTrainingRuntime"},
        f"kustomize emitted {sorted(docs)}",
    )
    patched = 0
    for kind, doc in docs.items():
        if kind not in CUSTOM:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        for where, template in pod_templates(doc):
            if where.endswith("dataset-initializer"):
                check(
                    "initContainers" not in template["spec"], f"kustomize: {where} got the sidecar"
                )
                continue
            check_pod(f"kustomize: {where}", template)
            patched += 1
    job = docs["Job"]["spec"]["template"]["spec"]
    check(
        [c["name"] for c in job["initContainers"]] == ["fetch-config", "shardfeed"],
        "kustomize: init containers replaced",
    )
    check(
        env_of(job["containers"][0]).get("EXISTING") == "1", "kustomize: the trainer's env replaced"
    )
    kinds = ", ".join(sorted(docs))
    return f"component applied to {kinds}: {patched} pod templates"


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
