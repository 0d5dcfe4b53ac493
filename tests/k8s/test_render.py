"""Every overlay and Job kustomization renders, every object is schema-valid (strict), and
the plain manifests `kubectl apply -f k8s/` reads are exactly what the sources render."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.apiserver import RESOURCES, empty_cluster
from tests.k8s.helpers import (
    GPU_RESOURCE,
    JOBS,
    K8S,
    KUBERNETES_VERSIONS,
    KUSTOMIZATIONS,
    OVERLAYS,
    REPO,
    key,
    kubectl,
    kubernetes_validate,
    kustomize,
    load_file,
    render_script,
    rendered,
)

RENDERED = render_script().OUTPUTS
"""The rendered files: k8s/negt2i.yaml (the platform) and the swap files in k8s/swap/."""


def test_every_overlay_declares_its_gpu_resource() -> None:
    # A new overlay must say which GPU resource its stage pods take (test_policies checks it).
    assert sorted(GPU_RESOURCE) == sorted(OVERLAYS)


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


def _validate(objs: list[dict] | tuple[dict, ...], version: str) -> list[str]:
    kv = kubernetes_validate()
    errors = []
    for obj in objs:
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            errors.append(f"{key(obj)}: {path}: {error.message}")
        except kv.SchemaNotFoundError as error:
            # An object without a schema (a CRD) would go unchecked: not allowed here.
            errors.append(f"{key(obj)}: {error.message}")
    return errors


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_objects_validate_strictly(name: str, version: str) -> None:
    errors = _validate(rendered(name), version)
    assert not errors, f"{name} against Kubernetes {version}:\n" + "\n".join(errors)


PLAIN_FILES = [o.path for o in RENDERED] + ["gpu-sharing/time-slicing-config.yaml"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", PLAIN_FILES)
def test_plain_manifest_files_validate_strictly(path: str, version: str) -> None:
    objs = load_file(K8S / path)
    assert objs
    errors = _validate(objs, version)
    assert not errors, f"k8s/{path} against Kubernetes {version}:\n" + "\n".join(errors)


def test_validation_rejects_an_unknown_field() -> None:
    # The strict schemas really are strict (a typo like `resource:` must not pass).
    kv = kubernetes_validate()
    deployment = dict(next(o for o in rendered("overlays/gpu") if o["kind"] == "Deployment"))
    bad = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kv.ValidationError, match="replica"):
        kv.validate(bad, KUBERNETES_VERSIONS[0], strict=True)


# --- the plain manifests: `kubectl apply -f k8s/` --------------------------------------------


@pytest.mark.parametrize("output", RENDERED, ids=lambda o: o.path)
def test_rendered_files_agree_with_their_sources(output: object) -> None:
    path = K8S / output.path  # type: ignore[attr-defined]
    assert path.read_text() == render_script().render(K8S, output), f"k8s/{output.path} is stale: run `make k8s`"  # type: ignore[attr-defined]


def test_the_platform_file_is_the_gpu_overlay() -> None:
    assert load_file(K8S / "negt2i.yaml") == list(rendered("overlays/gpu"))


def test_the_top_of_k8s_holds_only_rendered_manifests() -> None:
    # kubectl -f DIR sends every .json/.yaml/.yml file of DIR: no kustomization, patch or
    # Helm values may sit there, only rendered objects.
    top = {p.name for p in K8S.iterdir() if p.is_file() and p.suffix in (".json", ".yaml", ".yml")}
    assert top == {Path(o.path).name for o in RENDERED if "/" not in o.path} == {"negt2i.yaml"}
    # k8s/swap/ likewise holds rendered files only.
    assert {f"swap/{p.name}" for p in (K8S / "swap").iterdir()} == {
        o.path for o in RENDERED if o.path.startswith("swap/")
    }
    # kubectl creates in file order: the namespace before the objects that live in it.
    assert load_file(K8S / "negt2i.yaml")[0]["kind"] == "Namespace"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kubeconfig of an empty API server (tests/k8s/apiserver.py)."""
    with empty_cluster(tmp_path_factory.mktemp("cluster")) as kubeconfig:
        yield kubeconfig


def _kubectl_apply(args: list[str], kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl apply ARGS --dry-run=client` against the empty cluster, from the repository root."""
    return subprocess.run(
        # Schemas are checked strictly by kubernetes-validate; the empty server has no OpenAPI.
        [kubectl(), "apply", *args, "--dry-run=client", "--validate=false"],
        cwd=REPO,
        env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(kubeconfig.parent)},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _created(objs: list[dict] | tuple[dict, ...]) -> list[str]:
    """kubectl's report for creating ``objs``, in order: `<resource>[.<group>]/<name> created (dry run)`."""
    lines = []
    for obj in objs:
        group = obj["apiVersion"].rpartition("/")[0]
        assert any(kind == obj["kind"] for kinds in RESOURCES.values() for _, kind, _ in kinds), obj["kind"]
        lines.append(f"{obj['kind'].lower()}{'.' + group if group else ''}/{obj['metadata']['name']} created (dry run)")
    return lines


def test_kubectl_apply_f_k8s_deploys_the_platform(cluster: Path) -> None:
    # The operator's command, exactly as typed: `kubectl apply -f k8s/` (no -R, no -k).
    result = _kubectl_apply(["-f", "k8s/"], cluster)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == _created(load_file(K8S / "negt2i.yaml"))
    assert result.stdout.splitlines()[0] == "namespace/negt2i created (dry run)"
    # With -R kubectl would also send the sources (and fail on them): they are kept below the top.
    recursive = _kubectl_apply(["-R", "-f", "k8s/"], cluster)
    assert recursive.returncode != 0 and "deployment.apps/stage created" in recursive.stdout


def test_a_swap_is_one_file_and_one_object(cluster: Path) -> None:
    for swap in sorted((K8S / "swap").glob("*.yaml")):
        result = _kubectl_apply(["-f", str(swap.relative_to(REPO))], cluster)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["deployment.apps/detector created (dry run)"]


def test_kubectl_apply_k_deploys_every_variant_and_job(cluster: Path) -> None:
    for name in KUSTOMIZATIONS:
        result = _kubectl_apply(["-k", f"k8s/{name}"], cluster)
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert result.stdout.splitlines() == _created(rendered(name)), name


@pytest.fixture
def k8s_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    return copy


def test_a_stale_rendered_file_is_caught_and_make_k8s_fixes_it(k8s_copy: Path) -> None:
    # (The unedited copy is fresh: test_rendered_files_agree_with_their_sources.)
    script = render_script()
    stages = k8s_copy / "overlays" / "gpu" / "stages.yaml"
    stages.write_text(stages.read_text().replace("maxReplicas: 6", "maxReplicas: 5"))
    assert script.main(["--k8s", str(k8s_copy), "--check"]) == 1
    assert script.main(["--k8s", str(k8s_copy)]) == 0
    hpas = {
        o["metadata"]["name"]: o for o in load_file(k8s_copy / "negt2i.yaml") if o["kind"] == "HorizontalPodAutoscaler"
    }
    assert hpas["segmenter"]["spec"]["maxReplicas"] == 5


def test_registry_and_tag_are_set_in_one_place_and_reach_every_image(k8s_copy: Path) -> None:
    script = render_script()
    assert (
        script.main(["--k8s", str(k8s_copy), "--registry", "registry.example.com:5000/ml", "--tag", "0.2.0-rc1"]) == 0
    )
    assert script.release(k8s_copy) == ("registry.example.com:5000/ml", "0.2.0-rc1")
    images = {
        c["image"]
        for o in load_file(k8s_copy / "negt2i.yaml")
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers", [])
    }
    assert images == {
        f"registry.example.com:5000/ml/{n}:0.2.0-rc1"
        for n in ("detector", "segmenter", "attributes", "depth", "orchestrator")
    }
    # The Jobs take the same component.
    for job in JOBS:
        for obj in kustomize(k8s_copy / "jobs" / job):
            if obj["kind"] == "Job":
                for c in obj["spec"]["template"]["spec"]["containers"]:
                    assert c["image"].startswith("registry.example.com:5000/ml/") and c["image"].endswith(":0.2.0-rc1")
    for bad in (["--tag", "latest"], ["--registry", "Not A Registry"]):
        with pytest.raises(SystemExit, match=r"latest|registry|tag"):
            script.main(["--k8s", str(k8s_copy), *bad])
    assert script.release(k8s_copy) == ("registry.example.com:5000/ml", "0.2.0-rc1")
