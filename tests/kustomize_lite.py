"""Render the kustomizations under deploy/kubernetes without kubectl: the subset of kustomize they use.

Supported: `resources` (files, or directories holding a kustomization.yaml, rendered recursively),
`images` (newName/newTag on matching container images) and `patches` with a `path` to a strategic-merge
patch, which targets the resource of the same kind and name. Strategic merge as Kubernetes does it for
the fields the patches touch: maps merge recursively, lists of containers/env/volumes merge by `name`,
`volumeMounts` by `mountPath`, `ports` by `containerPort` (new items first); other lists are replaced.
Anything else in a kustomization is refused, so the test notices when the manifests outgrow this renderer.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}
KNOWN = {"apiVersion", "kind", "resources", "images", "patches"}


def render(directory: Path) -> list[Resource]:
    """The resources of the kustomization in `directory`, in order, with images and patches applied."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN
    if unknown:
        raise ValueError(f"{directory}: kustomization fields this renderer does not know: {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        resources += render(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise ValueError(f"{directory}: only `patches: - path: FILE` is supported, got {patch_entry}")
        patch = yaml.safe_load((directory / patch_entry["path"]).read_text())
        target = [r for r in resources
                  if r["kind"] == patch["kind"] and r["metadata"]["name"] == patch["metadata"]["name"]]
        if len(target) != 1:
            raise ValueError(f"{patch_entry['path']}: no single {patch['kind']}/{patch['metadata']['name']}")
        merged = merge(target[0], patch)
        resources[resources.index(target[0])] = merged
    for image in kustomization.get("images", []):
        resources = [set_image(resource, image) for resource in resources]
    return resources


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """`patch` merged into a copy of `base` (strategic merge, see the module docstring)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return out
    key = MERGE_KEYS.get(field)
    if key and isinstance(base, list) and isinstance(patch, list):
        items: list[Any] = copy.deepcopy(base)
        new: list[Any] = []
        for item in patch:
            match = [i for i, existing in enumerate(items) if existing.get(key) == item.get(key)]
            if match:
                items[match[0]] = merge(items[match[0]], item)
            else:
                new.append(copy.deepcopy(item))
        return new + items  # kustomize puts the items a patch adds first
    return copy.deepcopy(patch)


def set_image(resource: Resource, image: dict[str, str]) -> Resource:
    """kustomize's `images` transformer for the pod templates of workloads."""
    out = copy.deepcopy(resource)
    containers = out.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    for container in containers:
        name = container["image"].split(":")[0]
        if name == image["name"]:
            container["image"] = f"{image.get('newName', name)}:{image['newTag']}" if "newTag" in image \
                else image.get("newName", name)
    return out
