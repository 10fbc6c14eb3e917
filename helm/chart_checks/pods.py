"""The sidecar's invariants on every rendered pod template, the training world
a multi-node example forms, the platform's passthrough fields, the decode
pool and its NetworkPolicy."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import kubernetes_validate

from ._kit import CUSTOM, KUBERNETES, Doc, check, env_of, gibibytes, pod_templates, trainer_of
from .monitoring import check_query, check_rules, dashboard


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
