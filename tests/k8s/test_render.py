"""Every overlay and Job kustomization renders, and every object is schema-valid (strict)."""

from __future__ import annotations

import pytest

from tests.k8s.helpers import (
    JOBS,
    K8S,
    KUBERNETES_VERSIONS,
    KUSTOMIZATIONS,
    OVERLAYS,
    key,
    kubernetes_validate,
    rendered,
)


def test_every_kustomization_is_tested() -> None:
    # A new overlay or Job directory must be added to the lists the other tests iterate over.
    assert sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir()) == sorted(OVERLAYS)
    assert sorted(p.name for p in (K8S / "jobs").iterdir() if p.is_dir()) == sorted(JOBS)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renders_without_duplicates(name: str) -> None:
    objs = rendered(name)
    assert objs, f"{name} rendered nothing"
    keys = [key(o) for o in objs]
    assert len(keys) == len(set(keys)), f"duplicate objects in {name}"
    for obj in objs:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "negt2i", f"{key(obj)} in {name} has no namespace"
        assert obj["metadata"]["labels"].get("app.kubernetes.io/part-of") == "negt2ibench", key(obj)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_objects_validate_strictly(name: str, version: str) -> None:
    kv = kubernetes_validate()
    errors = []
    for obj in rendered(name):
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            errors.append(f"{key(obj)}: {path}: {error.message}")
        except kv.SchemaNotFoundError as error:
            # An object without a schema (a CRD) would go unchecked: not allowed here.
            errors.append(f"{key(obj)}: {error.message}")
    assert not errors, f"{name} against Kubernetes {version}:\n" + "\n".join(errors)


def test_validation_rejects_an_unknown_field() -> None:
    # The strict schemas really are strict (a typo like `resource:` must not pass).
    kv = kubernetes_validate()
    deployment = dict(next(o for o in rendered("overlays/gpu") if o["kind"] == "Deployment"))
    bad = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kv.ValidationError, match="replica"):
        kv.validate(bad, KUBERNETES_VERSIONS[0], strict=True)
