"""The generation Job (k8s/jobs/generate) and its image (docker/generate.Dockerfile): one GPU per shard,
shard counts that agree, the orchestrator reachable and nothing else, results the sweep's report Job
can merge, and an image that installs what `negt2i generate` imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib

from tests.k8s.helpers import (
    ORCHESTRATOR_PORT,
    REPO,
    STAGE_PORT,
    Endpoint,
    by_kind,
    connection_allowed,
    hadolint,
    release,
    rendered,
    tool,
)
from tests.k8s.test_dockerfiles import instructions

DOCKERFILE = REPO / "docker" / "generate.Dockerfile"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _job() -> tuple[dict, dict]:
    objs = rendered("jobs/generate")
    (job,) = by_kind(objs, "Job").values()
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"]
    return job, config


def test_one_indexed_shard_per_gpu_with_counts_that_agree() -> None:
    job, config = _job()
    data = config["data"]
    shards = int(data["GENERATE_SHARDS"])
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == shards
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # required by backoffLimitPerIndex
    (container,) = job["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    assert str(resources["requests"]["nvidia.com/gpu"]) == str(resources["limits"]["nvidia.com/gpu"]) == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in job["spec"]["template"]["spec"][
        "tolerations"
    ]
    script = container["command"][-1]
    assert "negt2i generate" in script and '--shard "$JOB_COMPLETION_INDEX/$GENERATE_SHARDS"' in script
    assert '--orchestrator "$NEGT2I_ORCHESTRATOR"' in script and "--device cuda" in script
    assert data["NEGT2I_ORCHESTRATOR"] == f"dns:///orchestrator:{ORCHESTRATOR_PORT}"
    # A preset the CLI knows, and generator weights that are read, never downloaded.
    from negt2i.generate import PRESETS

    assert data["GENERATE_MODEL"] in PRESETS
    assert data["HF_HUB_OFFLINE"] == "1" and data["HF_HOME"].startswith("/weights/")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["weights"] == {"name": "weights", "mountPath": "/weights", "readOnly": True}
    assert data["GENERATE_OUT"].startswith(mounts["images"]["mountPath"] + "/")
    assert not mounts["images"].get("readOnly")
    assert data["GENERATE_RESULTS"].startswith(mounts["results"]["mountPath"] + "/")
    assert container["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]


def test_shard_results_have_the_names_the_sweeps_report_job_merges() -> None:
    job, _ = _job()
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert 'out="$GENERATE_RESULTS/shard-$JOB_COMPLETION_INDEX-of-$GENERATE_SHARDS"' in script
    assert '--results "$out.jsonl"' in script and 'touch "$out.done"' in script
    sweep = by_kind(rendered("jobs/sweep"), "Job")["negt2i-report"]
    (merge,) = sweep["spec"]["template"]["spec"]["containers"]
    assert "$SWEEP_RESULTS/shard-$i-of-$SWEEP_SHARDS.jsonl" in merge["command"][-1]


def test_the_generate_pods_reach_the_orchestrator_and_nothing_else() -> None:
    job, _ = _job()
    pod = Endpoint(job["spec"]["template"]["metadata"]["labels"])
    objs = rendered("overlays/gpu")
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    deployments = by_kind(objs, "Deployment")

    def labels(name: str) -> dict[str, str]:
        return deployments[name]["spec"]["template"]["metadata"]["labels"]

    assert connection_allowed(policies, pod, Endpoint(labels("orchestrator")), ORCHESTRATOR_PORT)
    assert not connection_allowed(policies, pod, Endpoint(labels("detector")), STAGE_PORT)
    assert not connection_allowed(policies, pod, Endpoint(namespace=None, ip="203.0.113.7"), 443)
    assert connection_allowed(policies, pod, Endpoint({"k8s-app": "kube-dns"}, namespace="kube-system"), 53, "UDP")


def test_the_image_is_linted_built_by_make_and_runs_as_the_jobs_user() -> None:
    result = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                            check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    instrs = instructions(DOCKERFILE)
    users = [args for ins, args in instrs if ins == "USER"]
    job, _ = _job()
    ctx = job["spec"]["template"]["spec"]["securityContext"]
    assert users[-1] == f"{ctx['runAsUser']}:{ctx['runAsGroup']}"
    env = " ".join(args for ins, args in instrs if ins == "ENV")
    assert "HF_HUB_OFFLINE=1" in env
    for ins, args in instrs:
        if ins in ("COPY", "ADD"):
            assert not re.search(r"\.(pt|pth|safetensors|bin|ckpt|onnx)\b|weights", args.replace("docker/", "")), args
    env = {k: v for k, v in os.environ.items() if k not in ("VERSION", "REGISTRY", "REVISION", "MAKEFLAGS")}
    make = subprocess.run(
        [tool("make", "GNU make, from the system"), "-n", "--no-print-directory", "image-generate", "REVISION=test"],
        cwd=REPO, env=env, check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert make.returncode == 0, make.stderr
    command = make.stdout.strip().splitlines()[-1]
    registry, tag = release()  # the one place for every image's registry and tag
    assert f"-f {DOCKERFILE.relative_to(REPO)}" in command and f"-t {registry}/generate:{tag}" in command
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{registry}/generate:{tag}" and tag == VERSION


def test_the_image_installs_everything_negt2i_generate_imports() -> None:
    runs = " ".join(args for ins, args in instructions(DOCKERFILE) if ins == "RUN")
    found = re.findall(r"requirements\.py --pyproject /build/pyproject\.toml ([^>]*)> /build/(\w+)\.txt", runs)
    lists = {name: args for args, name in found}  # the shared `requirements` stage derives every image's list
    assert list(lists) == ["torch", "requirements", "generate"]
    copies = [a for ins, a in instructions(DOCKERFILE) if ins == "COPY" and a.startswith("--from=requirements")]
    assert copies == ["--from=requirements /build/torch.txt /build/",
                      "--from=requirements /build/generate.txt /build/requirements.txt"]  # fmt: skip
    requirements: list[str] = []
    for name in ("torch", "generate"):
        requirements += subprocess.run([sys.executable, "docker/requirements.py", *lists[name].split()], cwd=REPO,
                                       check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    modules = ["negt2i.cli", "negt2i.cli.generate_cmd", "negt2i.generate.runner", "negt2i.generate.scoring",
               "negt2i.generate.diffusers_backend", "negt2i.client",
               "diffusers", "accelerate", "transformers",
               # the judges Job (k8s/jobs/judges) runs this image too
               "negt2i.cli.judges_cmd", "negt2i.judges.harness", "negt2i.judges.vlm", "negt2i.judges.clip_score",
               "open_clip"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "tests/k8s/import_closure.py", json.dumps(requirements), json.dumps(modules)],
        cwd=REPO, check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    blocked = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert {"pytest", "bentoml", "rfdetr", "sam2"} <= blocked  # no test tools, no stage models in this image
