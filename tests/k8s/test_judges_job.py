"""The judges Job (k8s/jobs/judges): one GPU per image shard, shard counts that agree, judges and modes the
harness knows, weights read-only and never downloaded, shard files `negt2i agreement --judges` reads."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.k8s.helpers import by_kind, release, rendered


def _job() -> tuple[dict, dict]:
    objs = rendered("jobs/judges")
    (job,) = by_kind(objs, "Job").values()
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"]
    return job, config


def test_one_indexed_image_shard_per_gpu_with_judges_the_registry_knows() -> None:
    from negt2i.judges.registry import backend

    job, config = _job()
    data = config["data"]
    shards = int(data["JUDGES_SHARDS"])
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == shards
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    registry, tag = release()
    assert container["image"] == f"{registry}/generate:{tag}"  # the image with the judges extra
    assert all(backend(j).kind == "vqa" for j in data["JUDGES_VQA"].split())
    assert all(backend(j).kind == "score" for j in data["JUDGES_SCORE"].split())
    assert set(data["JUDGES_MODES"].split()) <= {"whole", "pos", "neg"}
    assert data["HF_HUB_OFFLINE"] == "1" and data["NEGT2I_WEIGHTS_DIR"] == "/weights"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["weights"] == {"name": "weights", "mountPath": "/weights", "readOnly": True}
    assert data["JUDGES_IMAGES"].startswith(mounts["images"]["mountPath"] + "/")
    assert data["JUDGES_QUESTIONS"].startswith(mounts["images"]["mountPath"] + "/")
    assert data["JUDGES_RESULTS"].startswith(mounts["results"]["mountPath"] + "/")


def test_each_pod_runs_every_judge_and_mode_on_its_shard(tmp_path: Path) -> None:
    """The pod's script, run with a stand-in `negt2i`: one resumable run per judge and mode, shard I/N."""
    job, config = _job()
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    env = {**os.environ, **config["data"], "JOB_COMPLETION_INDEX": "2", "JUDGES_RESULTS": str(tmp_path)}
    fake = 'negt2i() { echo "$@"; };\n'
    out = subprocess.run(["sh", "-c", fake + script], env=env, check=True, capture_output=True, text=True).stdout
    runs = [line.split() for line in out.splitlines()]
    data = config["data"]
    n = int(data["JUDGES_SHARDS"])
    expected = {(j, m) for j in data["JUDGES_VQA"].split() for m in data["JUDGES_MODES"].split()}
    expected |= {(j, "score") for j in data["JUDGES_SCORE"].split()}
    got = {(r[r.index("--judge") + 1], r[r.index("--mode") + 1]) for r in runs}
    assert got == expected and len(runs) == len(expected)
    for r in runs:
        assert r[:2] == ["judges", "run"] and r[r.index("--shard") + 1] == f"2/{n}" and "--device" in r
        judge, mode = r[r.index("--judge") + 1], r[r.index("--mode") + 1]
        assert r[r.index("--out") + 1] == f"{tmp_path}/{judge}-{mode}/shard-2-of-{n}.jsonl"
        assert (tmp_path / f"{judge}-{mode}" / f"shard-2-of-{n}.done").is_file()
