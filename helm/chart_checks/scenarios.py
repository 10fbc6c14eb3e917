"""Each example rendered and checked whole, the values the schema must refuse,
and the library included from a chart of one's own."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from ._kit import (
    CHART,
    IMAGE,
    LIBRARY,
    OWN_CHART,
    Doc,
    check,
    documents,
    pod_templates,
    render,
    run,
    tool,
)
from .pods import check_documents, check_passthrough, check_pool, check_world


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
