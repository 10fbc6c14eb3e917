"""Checks the Helm chart.

With `helm` on PATH: `helm lint` and `helm template`, and the rendered
manifests must parse as YAML. Without it (this project's machines: helm is in
none of the package registries they reach), a structural check: Chart.yaml and
values.yaml parse, and every `.Values.x.y` a template reads exists in
values.yaml.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent / "shardfeed"


def lookup(values: dict, path: list[str]) -> bool:  # type: ignore[type-arg]
    node: object = values
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def main() -> int:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "shardfeed", chart
    missing = []
    for template in sorted((CHART / "templates").iterdir()):
        for match in re.finditer(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            path = match.group(1).split(".")
            if not lookup(values, path):
                missing.append(f"{template.name}: .Values.{match.group(1)}")
    if missing:
        print("templates read values that values.yaml does not define:\n  " + "\n  ".join(missing))
        return 1
    helm = shutil.which("helm")
    if helm is None:
        print("chart structure ok (helm not installed: templates not rendered)")
        return 0
    subprocess.run([helm, "lint", str(CHART)], check=True)
    rendered = subprocess.run(
        [helm, "template", "test", str(CHART)], check=True, capture_output=True, text=True
    ).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = sorted(d["kind"] for d in documents)
    print(f"chart renders: {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
