"""The Dockerfiles: hadolint-clean, pinned bases, dependency layers before code, non-root,
HEALTHCHECK, OCI labels, no weights, and in agreement with the manifests and the Makefile.

No Docker engine runs here; the images themselves are built by `make images` elsewhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.k8s.helpers import ORCHESTRATOR_PORT, REPO, STAGE_PORT, STAGES, by_kind, hadolint, release, rendered, tool

STAGE_DOCKERFILE = REPO / "services" / "Dockerfile"
"""The one Dockerfile of the four stage images (build argument STAGE)."""
DOCKERFILES = {"stage": STAGE_DOCKERFILE, "orchestrator": REPO / "orchestrator" / "Dockerfile"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
SERVICE_CLASSES = {"detector": "Detector", "segmenter": "Segmenter", "attributes": "Attributes", "depth": "Depth"}
CODE_PATHS = ("negt2i", "services", "orchestrator")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
    assert not pending, f"{path}: dangling line continuation"
    return out


def _first(instrs: list[tuple[str, str]], predicate: object) -> int:
    return next(i for i, ins in enumerate(instrs) if predicate(ins))  # type: ignore[operator]


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", *map(str, DOCKERFILES.values())],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_images_are_pinned_to_exact_versions(name: str) -> None:
    images = [args.split()[0] for ins, args in instructions(DOCKERFILES[name]) if ins == "FROM"]
    assert images
    for image in images:
        _, _, tag = image.partition(":")
        assert tag and tag != "latest", f"{image}: no explicit tag"
        # An exact patch release, never a floating major/minor tag.
        assert re.match(r"\d+\.\d+\.\d+(-|$)", tag), f"{image}: tag {tag!r} is not an exact version"
    python = re.compile(r"3\.11\.\d+")
    if name == "stage":
        assert any(i.startswith("nvidia/cuda:") and i.endswith("-ubuntu22.04") for i in images)
        run = " ".join(args for ins, args in instructions(DOCKERFILES[name]) if ins == "RUN")
        assert python.search(run), "the stage images must install an exact CPython 3.11.x"
    else:
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", images[0]), images[0]
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.12"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dependencies_are_installed_before_the_code_is_copied(name: str) -> None:
    instrs = instructions(DOCKERFILES[name])
    deps = _first(instrs, lambda ins: ins[0] == "RUN" and "requirements.txt" in ins[1] and "install" in ins[1])
    code = _first(instrs, lambda ins: ins[0] == "COPY" and any(f" {p}" in f" {ins[1]}" for p in CODE_PATHS))
    assert deps < code
    before = [args for ins, args in instrs[:deps] if ins in ("COPY", "ADD")]
    # Only the dependency description reaches the dependency layers.
    assert before and all(
        set(a.split()[:-1]) <= {"pyproject.toml", "docker/requirements.py", "docker/constraints.txt"} for a in before
    ), before
    assert "-c /build/constraints.txt" in instrs[deps][1], "install with the tested constraints"
    # Build arguments that change per build (version, revision) come after the dependency
    # layers: an ARG in scope changes the cache key of every later RUN.
    version_arg = _first(instrs, lambda ins: ins[0] == "ARG" and ins[1].startswith("VERSION"))
    assert version_arg > deps
    assert all(ins != "RUN" for ins, _ in instrs[version_arg:]), "no RUN after ARG VERSION"


def test_one_dockerfile_builds_the_four_stage_images() -> None:
    # No per-stage copies: services/<stage>/ holds the service code only.
    assert sorted(REPO.glob("services/**/Dockerfile")) == [STAGE_DOCKERFILE]
    instrs = instructions(STAGE_DOCKERFILE)
    (stage_arg,) = [i for i, ins in enumerate(instrs) if ins == ("ARG", "STAGE")]
    # STAGE is declared after every layer that has content (RUN, COPY): the four images share
    # them all and differ only in metadata (an ARG in scope changes the cache key of every later RUN).
    assert all(ins not in ("RUN", "COPY", "ADD") for ins, _ in instrs[stage_arg:])
    assert all("STAGE" not in args for _, args in instrs[:stage_arg])
    env = " ".join(args for ins, args in instrs[stage_arg:] if ins == "ENV")
    assert "NEGT2I_STAGE=${STAGE}" in env


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_the_non_root_user_the_manifests_expect(name: str) -> None:
    users = [args for ins, args in instructions(DOCKERFILES[name]) if ins == "USER"]
    assert users, "no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric non-root uid (runAsNonRoot can only verify numbers)"
    for deployment in STAGES if name == "stage" else ("orchestrator",):
        pod = by_kind(rendered("overlays/gpu"), "Deployment")[deployment]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == int(uid)
        assert pod["securityContext"]["runAsGroup"] == int(gid)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_healthcheck_labels_port_and_command(name: str) -> None:
    instrs = instructions(DOCKERFILES[name])
    (healthcheck,) = [args for ins, args in instrs if ins == "HEALTHCHECK"]
    assert "CMD" in healthcheck and "negt2i-healthcheck" in healthcheck
    labels = " ".join(args for ins, args in instrs if ins == "LABEL")
    for label in ("title", "description", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{label}=" in labels, label
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    title = "${STAGE}" if name == "stage" else name
    assert f'org.opencontainers.image.title="negt2i-{title}"' in labels
    (expose,) = [args for ins, args in instrs if ins == "EXPOSE"]
    (cmd,) = [json.loads(args) for ins, args in instrs if ins == "CMD"]
    if name == "stage":
        assert expose == str(STAGE_PORT)
        assert f"http://127.0.0.1:{STAGE_PORT}/readyz" in healthcheck
        # sh -c only to put NEGT2I_STAGE into the target; exec hands PID 1 to BentoML.
        assert cmd[:2] == ["sh", "-c"]
        script = cmd[2]
        assert f'exec bentoml serve "services.$NEGT2I_STAGE.service" --host 0.0.0.0 --port {STAGE_PORT};;' in script
        (accepted,) = re.findall(r'case "\$NEGT2I_STAGE" in ([\w|]+)\)', script)
        assert accepted.split("|") == list(STAGES)
        for stage in STAGES:  # the module-only target needs exactly one service per module
            service = (REPO / "services" / stage / "service.py").read_text()
            assert len(re.findall(r"^@bentoml\.service\b", service, re.MULTILINE)) == 1, stage
            assert re.search(rf"^class {SERVICE_CLASSES[stage]}\b", service, re.MULTILINE), stage
    else:
        assert expose == str(ORCHESTRATOR_PORT)
        assert f"grpc://127.0.0.1:{ORCHESTRATOR_PORT}" in healthcheck
        assert cmd == ["python", "-m", "orchestrator"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_no_weights_in_the_image(name: str) -> None:
    instrs = instructions(DOCKERFILES[name])
    for ins, args in instrs:
        if ins in ("COPY", "ADD"):
            assert not re.search(r"\.(pt|pth|safetensors|bin|ckpt|onnx)\b|weights", args.replace("docker/", "")), args
        assert ins != "ADD" or not args.startswith("http"), "no downloads by ADD"
    env = " ".join(args for ins, args in instrs if ins == "ENV")
    if name == "stage":
        assert "NEGT2I_WEIGHTS_DIR=/weights" in env
        assert "HF_HUB_OFFLINE=1" in env  # a missing weight is an error, never a download


def test_copied_files_exist_and_pass_the_dockerignore() -> None:
    allowed = [
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    for name, path in DOCKERFILES.items():
        for ins, args in instructions(path):
            if ins != "COPY" or args.startswith("--from"):
                continue
            for source in args.split()[:-1]:
                assert (REPO / source).exists(), f"{name}: COPY {source}: no such path"
                assert any(source == a or source.startswith(a + "/") for a in allowed), (
                    f"{name}: COPY {source} is excluded by .dockerignore"
                )
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert next(line for line in ignored if not line.startswith("#")) == "*", "allow-list"


@pytest.mark.parametrize("name", [*STAGES, "orchestrator"])
def test_make_target_builds_the_image_the_manifests_run(name: str) -> None:
    result = subprocess.run(
        [tool("make", "GNU make, from the system"), "-n", "--no-print-directory", f"image-{name}", "REVISION=test"],
        cwd=REPO,
        # The Makefile's defaults are under test, not a CI job's VERSION, REGISTRY or TAG.
        env={k: v for k, v in os.environ.items() if k not in ("VERSION", "REGISTRY", "TAG", "REVISION", "MAKEFLAGS")},
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1]
    assert "docker build" in command
    registry, tag = release()
    if name == "orchestrator":
        assert f"-f {DOCKERFILES['orchestrator'].relative_to(REPO)} " in command
        assert "STAGE=" not in command
    else:
        assert f"-f {STAGE_DOCKERFILE.relative_to(REPO)} " in command
        assert f"--build-arg STAGE={name} " in command
    # The name comes from the release component: exactly what the manifests run.
    assert f"-t {registry}/{name}:{tag} " in command
    assert f"--build-arg VERSION={VERSION}" in command
    assert command.endswith(" .")
    images = {
        c["image"]
        for o in rendered("overlays/gpu")
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert f"{registry}/{name}:{tag}" in images


IMAGE_MODULES = {
    # The gRPC server, and the client commands the Jobs run (`negt2i submit`, `negt2i report`:
    # their command modules import these lazily).
    "orchestrator": [
        "orchestrator.server",
        "negt2i.cli",
        "negt2i.client",
        "negt2i.evaluate",
        "negt2i.metrics.report",
        "matplotlib.pyplot",
    ],
    # The BentoML services, and `negt2i weights fetch` (the weights-fetch Job runs the detector image).
    "stage": ["services.common", *(f"services.{s}.service" for s in STAGES), "negt2i.cli", "negt2i.weights"],
}


@pytest.mark.parametrize("name", IMAGE_MODULES)
def test_the_image_installs_everything_its_code_imports(name: str) -> None:
    # The requirements exactly as the Dockerfile computes them, then an import of the code
    # with every package outside their closure blocked (tests/k8s/import_closure.py).
    runs = " ".join(args for ins, args in instructions(DOCKERFILES[name]) if ins == "RUN")
    found = re.search(r"requirements\.py --pyproject /build/pyproject\.toml ([^>]*)> /build/requirements\.txt", runs)
    assert found, "the dependency RUN no longer matches this test"
    requirements = subprocess.run(
        [sys.executable, "docker/requirements.py", *found.group(1).split()],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    result = subprocess.run(
        [
            sys.executable,
            "tests/k8s/import_closure.py",
            json.dumps(requirements),
            json.dumps(IMAGE_MODULES[name]),
            # What the stage image's CMD serves: `bentoml serve services.<stage>.service`.
            json.dumps([f"services.{s}.service" for s in STAGES] if name == "stage" else []),
        ],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode == 3:
        pytest.fail(result.stderr.strip(), pytrace=False)
    assert result.returncode == 0, result.stderr[-3000:]
    blocked = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert "pytest" in blocked  # the check is live: dev tools are not in any image
    if name == "orchestrator":
        assert {"torch", "bentoml"} <= blocked  # and the orchestrator image stays small
