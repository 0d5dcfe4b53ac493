"""The Dockerfiles: hadolint-clean, pinned bases given as build arguments, one literal target per
stage, dependency layers before code, every installed distribution pinned, the torch stage shared
with the generate image, no build leftovers, non-root, HEALTHCHECK, OCI labels, no weights, and in
agreement with the manifests and the Makefile.

These are static checks (they run in CI); `make container-test` builds and runs the images
(tests/containers, docs/deployment.md)."""

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
from tests.lockfile import lock_entries, lock_version

STAGE_DOCKERFILE = REPO / "services" / "Dockerfile"
"""The one Dockerfile of the four stage images (one build target per stage)."""
GENERATE_DOCKERFILE = REPO / "docker" / "generate.Dockerfile"
DOCKERFILES = {"stage": STAGE_DOCKERFILE, "orchestrator": REPO / "orchestrator" / "Dockerfile"}
ALL_DOCKERFILES = {**DOCKERFILES, "generate": GENERATE_DOCKERFILE}
TORCH_BEGIN = "ARG UV_IMAGE="
TORCH_END = "# ---- end of the torch stage ----"
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


def stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    """The instructions of each build stage by its name (``FROM ... AS name``), ``""`` for the global ARGs."""
    out: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for ins, args in instructions(path):
        if ins == "FROM":
            words = args.split()
            current = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"#{len(out)}"
            out[current] = []
        out[current].append((ins, args))
    return out


def global_args(path: Path) -> dict[str, str]:
    """The defaults of the ARGs declared before the first FROM (the ones a FROM line can use)."""
    out = {}
    for ins, args in stages(path)[""]:
        assert ins == "ARG", f"{path}: only ARG may come before the first FROM"
        name, _, default = args.partition("=")
        out[name] = default.strip('"')
    return out


def base_images(path: Path) -> dict[str, str]:
    """Each FROM's image as written (``${CUDA_IMAGE}``) -> resolved with the ARG defaults; build stages
    used as bases (``FROM runtime AS detector``) are left out."""
    names = set(stages(path))
    defaults = global_args(path)
    out = {}
    for ins, args in instructions(path):
        image = args.split()[0]
        if ins != "FROM" or image in names:
            continue
        out[image] = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image)
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


@pytest.mark.parametrize("name", ALL_DOCKERFILES)
def test_base_images_are_build_arguments_pinned_to_exact_versions(name: str) -> None:
    """Each public base image is a build argument (an air-gapped or mirrored registry needs no edit of the
    Dockerfile) whose default is an exact release, never a floating tag."""
    path = ALL_DOCKERFILES[name]
    images = base_images(path)
    assert images
    for written, image in images.items():
        assert re.fullmatch(r"\$\{[A-Z_]+_IMAGE\}", written), f"{written}: not a build argument"
        _, _, tag = image.partition(":")
        assert tag and tag != "latest", f"{image}: no explicit tag"
        # An exact patch release, never a floating major/minor tag.
        assert re.match(r"\d+\.\d+\.\d+(-|$)", tag), f"{image}: tag {tag!r} is not an exact version"
    resolved = set(images.values())
    # uv installs every image's packages, at the version requirements.lock pins for `make setup` too
    uv_images = {i for i in resolved if i.startswith("ghcr.io/astral-sh/uv:")}
    assert uv_images == {f"ghcr.io/astral-sh/uv:{lock_version('uv')}"}, uv_images
    if name == "orchestrator":
        python = {re.sub(r"3\.11\.\d+", "3.11.N", i) for i in resolved - uv_images}
        assert python == {"python:3.11.N-slim-bookworm"}, resolved
    else:
        assert any(i.startswith("nvidia/cuda:") and i.endswith("-ubuntu22.04") for i in resolved)
        assert any(i.startswith("ghcr.io/astral-sh/uv:") for i in resolved)
        # the Python the image runs: an exact CPython 3.11.x, a build argument too (docs/deployment.md)
        (python,) = [a for ins, a in stages(path)["python"] if ins == "ARG" and a.startswith("PYTHON_VERSION=")]
        assert re.fullmatch(r"PYTHON_VERSION=3\.11\.\d+", python)
        run = " ".join(args for ins, args in instructions(path) if ins == "RUN")
        assert 'uv python install "$PYTHON_VERSION"' in run and 'uv venv --python "$PYTHON_VERSION"' in run
    from packaging.specifiers import SpecifierSet

    assert "3.11.14" in SpecifierSet(PYPROJECT["project"]["requires-python"])  # the images' Python is supported
    deployment = (REPO / "docs" / "deployment.md").read_text()
    for arg in global_args(path):
        assert f"`{arg}`" in deployment, f"docs/deployment.md does not document the build argument {arg}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dependencies_are_installed_before_the_code_is_copied(name: str) -> None:
    instrs = instructions(DOCKERFILES[name])
    deps = _first(instrs, lambda ins: ins[0] == "RUN" and "requirements.txt" in ins[1] and "install" in ins[1])
    code = _first(instrs, lambda ins: ins[0] == "COPY" and any(f" {p}" in f" {ins[1]}" for p in CODE_PATHS))
    assert deps < code
    before = [args for ins, args in instrs[:deps] if ins in ("COPY", "ADD")]
    # Only the dependency description reaches the dependency layers: pyproject.toml only in the `requirements`
    # stage, which derives the lists the install layers copy (an edit to pyproject.toml that changes no list
    # rebuilds no dependency layer).
    allowed = {"pyproject.toml", "docker/requirements.py", "requirements.lock"}
    assert before and all(
        set(a.split()[:-1]) <= allowed
        or (a.startswith("--from=requirements ") and all(w.startswith("/build/") for w in a.split()[1:]))
        for a in before
    ), before
    built = stages(DOCKERFILES[name])
    copies_pyproject = {s for s, ins in built.items() if any(i == "COPY" and "pyproject.toml" in a.split()[:-1]
                                                             and "/src/" not in a for i, a in ins)}  # fmt: skip
    assert copies_pyproject == {"requirements"}, copies_pyproject
    assert "-c /build/requirements.lock" in instrs[deps][1], "install with the tested constraints"
    # Build arguments that change per build (version, revision) come after the dependency
    # layers: an ARG in scope changes the cache key of every later RUN.
    version_arg = _first(instrs, lambda ins: ins[0] == "ARG" and ins[1].startswith("VERSION"))
    assert version_arg > deps
    assert all(ins != "RUN" for ins, _ in instrs[version_arg:]), "no RUN after ARG VERSION"


def test_one_dockerfile_one_literal_target_per_stage() -> None:
    """Distinct stage images by construction: each stage is a build target whose values are literals (no
    build argument decides the stage: buildah gave four identical images that way, buildah issue 5575);
    the targets add metadata only over one shared stage, so the four images share every layer."""
    # No per-stage copies: services/<stage>/ holds the service code only.
    assert sorted(REPO.glob("services/**/Dockerfile")) == [STAGE_DOCKERFILE]
    built = stages(STAGE_DOCKERFILE)
    assert list(built)[-1] == "no-stage"  # a build without --target: an image that refuses to start
    assert all(ins != "ARG" or not args.startswith("STAGE") for ins, args in instructions(STAGE_DOCKERFILE))
    for stage in STAGES:
        instrs = built[stage]
        assert instrs[0] == ("FROM", f"runtime AS {stage}")
        assert {ins for ins, _ in instrs[1:]} <= {"LABEL", "ENV", "CMD"}, instrs  # metadata only
        assert all("$" not in args for _, args in instrs[1:]), f"{stage}: literal values only"
        labels = " ".join(args for ins, args in instrs if ins == "LABEL")
        assert f'org.opencontainers.image.title="negt2i-{stage}"' in labels
        assert f'io.negt2i.stage="{stage}"' in labels
        assert ("ENV", f"NEGT2I_STAGE={stage}") in instrs
        (cmd,) = [json.loads(args) for ins, args in instrs if ins == "CMD"]
        assert cmd == ["bentoml", "serve", f"services.{stage}.service", "--host", "0.0.0.0", "--port", str(STAGE_PORT)]
        # the module-only target needs exactly one service per module
        service = (REPO / "services" / stage / "service.py").read_text()
        assert len(re.findall(r"^@bentoml\.service\b", service, re.MULTILINE)) == 1, stage
        assert re.search(rf"^class {SERVICE_CLASSES[stage]}\b", service, re.MULTILINE), stage
    (refuse,) = [json.loads(a) for ins, a in built["no-stage"] if ins == "CMD"]
    assert refuse[:2] == ["sh", "-c"] and "exit 2" in refuse[2] and all(s in refuse[2] for s in STAGES)
    # every layer with content is in the shared stages
    assert all(ins not in ("RUN", "COPY", "ADD") for name in (*STAGES, "no-stage") for ins, _ in built[name])


def test_the_torch_stage_is_identical_in_the_stage_and_generate_dockerfiles() -> None:
    """The generate image shares the Python and torch layers with the stage images: the `torch` stage (and
    what it is built from) is the same text in both files, and it installs torch and torchvision only."""
    texts = {name: ALL_DOCKERFILES[name].read_text() for name in ("stage", "generate")}
    shared = {name: t[t.index(TORCH_BEGIN) : t.index(TORCH_END)] for name, t in texts.items()}
    assert shared["stage"] == shared["generate"]
    for name in ("stage", "generate"):
        built = stages(ALL_DOCKERFILES[name])
        (derive,) = [a for ins, a in built["requirements"] if ins == "RUN"]
        assert "--only torch,torchvision models > /build/torch.txt" in derive
        torch_stage = built["torch"]
        assert ("COPY", "--from=requirements /build/torch.txt /build/") in torch_stage
        assert all("pyproject.toml" not in a for _, a in torch_stage)  # only the derived list reaches the layer
        (install,) = [a for ins, a in torch_stage if ins == "RUN" and "torch.txt" in a]
        assert "uv pip install -c /build/requirements.lock -r /build/torch.txt &&" in install
        after = "runtime" if name == "stage" else "generate"
        assert stages(ALL_DOCKERFILES[name])[after][0] == ("FROM", f"torch AS {after}")  # built on it


@pytest.mark.parametrize("name", ALL_DOCKERFILES)
def test_every_installed_distribution_is_pinned(name: str) -> None:
    """Each install uses the tested constraints and is followed, in the same layer, by the check that every
    distribution installed is pinned there (``docker/requirements.py --check-pinned``); packages named on
    an install line are pinned in requirements.lock."""
    pins = lock_entries()
    installs = [a for ins, a in instructions(ALL_DOCKERFILES[name]) if ins == "RUN" and "install" in a]
    for run in installs:
        for command in re.split(r"&&", run):
            if not re.search(r"\bpip install\b", command):
                continue
            if command.rstrip().endswith(" /src"):  # the project itself: no dependencies, build tools locked
                assert "--no-deps --build-constraint /build/requirements.lock /src" in command, command
                continue
            assert "-c /build/requirements.lock" in command, command
            words = command.split()
            for i, word in enumerate(words):
                if word.startswith("-") or words[i - 1] in ("-c", "-r", "--no-build-isolation-package",
                                                            "--build-constraint"):  # fmt: skip
                    continue
                if word in ("pip", "install", "uv", "python") or ("=" in word and word.split("=")[0].isupper()):
                    continue
                assert re.sub(r"[-_.]+", "-", word).lower() in pins, f"{name}: {word} is not pinned"
    deps = [a for a in installs if "requirements.txt" in a]
    assert deps and all("requirements.py --check-pinned /build/requirements.lock" in a for a in deps)


def test_the_pinned_check_names_what_is_not_pinned(tmp_path: Path) -> None:
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"], check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    good = tmp_path / "good.txt"
    good.write_text(frozen)
    check = [sys.executable, "docker/requirements.py", "--check-pinned"]
    ok = subprocess.run([*check, str(good)], cwd=REPO, capture_output=True, text=True, check=False, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(line for line in frozen.splitlines() if not line.lower().startswith("numpy==")))
    no = subprocess.run([*check, str(bad)], cwd=REPO, capture_output=True, text=True, check=False, timeout=60)
    assert no.returncode == 1 and "numpy==" in no.stderr and "not pinned" in no.stderr
    ignored = subprocess.run([*check, str(bad), "--ignore", "numpy"], cwd=REPO, capture_output=True, text=True,
                             check=False, timeout=60)  # fmt: skip
    assert ignored.returncode == 0, ignored.stderr


@pytest.mark.parametrize("name", ALL_DOCKERFILES)
def test_no_build_leftovers(name: str) -> None:
    """Every RUN that installs something clears /tmp in its own layer (its last command), and the last RUN
    removes the sources and build inputs."""
    runs = [a for ins, a in instructions(ALL_DOCKERFILES[name]) if ins == "RUN"]
    installs = [a for a in runs if "install" in a]
    assert installs
    for run in installs:
        last = run.split("&&")[-1].split()
        assert last[:2] == ["rm", "-rf"] and "/tmp/*" in last, run
    assert "rm -rf /src /build /tmp/*" in runs[-1]
    mounts = " ".join(runs)
    assert "--mount=type=cache,target=/root/.cache/uv" in mounts or name == "orchestrator"  # a cache, not a layer
    if name == "orchestrator":  # no uv cache mount there: no cache at all, so nothing is left in a layer
        env = " ".join(a for ins, a in instructions(ALL_DOCKERFILES[name]) if ins == "ENV")
        assert "UV_NO_CACHE=1" in env.split()


def test_the_orchestrator_image_listens_on_every_interface_and_bare_metal_on_loopback() -> None:
    from orchestrator.settings import Settings

    env = " ".join(args for ins, args in instructions(DOCKERFILES["orchestrator"]) if ins == "ENV")
    assert "NEGT2I_HOST=0.0.0.0" in env  # a published port reaches the server in its container
    assert Settings.from_env({}).host == "127.0.0.1"  # python -m orchestrator on a host: loopback only


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
    (expose,) = [args for ins, args in instrs if ins == "EXPOSE"]
    if name == "stage":
        for stage in STAGES:  # each target's title (the targets themselves: test_one_dockerfile_one_literal...)
            assert f'org.opencontainers.image.title="negt2i-{stage}"' in labels
        assert expose == str(STAGE_PORT)
        assert f"http://127.0.0.1:{STAGE_PORT}/readyz" in healthcheck
    else:
        assert 'org.opencontainers.image.title="negt2i-orchestrator"' in labels
        (cmd,) = [json.loads(args) for ins, args in instrs if ins == "CMD"]
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
        assert f"--target {name} " in command and "STAGE=" not in command
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
