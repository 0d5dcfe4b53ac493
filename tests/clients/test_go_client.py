"""A Go client (clients/go/negt2i-go) against a real orchestrator, its stubs generated from the shipped protos
with Debian's packaged toolchain (protoc 3.21, protoc-gen-go 1.28, protoc-gen-go-grpc 1.0 from grpc-go 1.33,
Go 1.19) by the exact commands of docs/api.md ("Go"), and built offline against Debian's Go packages.

It reads health (with the stage details), GetServiceInfo, and judges the demo set by unary calls and over one
stream: every verdict, field for field, as the Python client's, and the same outcome as ``negt2i submit``'s
results file; a bad item's rich error details decode in Go."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from negt2i.cli import main
from negt2i.client import EvaluatorClient, make_request
from negt2i.core.spec import parse_prompt
from negt2i.wire.v1 import evaluator_pb2
from tests.clients.conftest import STAGES
from tests.services.live import REPO, Proc

pytestmark = pytest.mark.xdist_group("clients")

API_DOC = REPO / "docs" / "api.md"
GO_CLIENT = REPO / "clients" / "go" / "negt2i-go"
TOOLS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")
GOCODE = Path("/usr/share/gocode/src")
PACKAGES = ("google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto/googleapis/rpc")


def doc_block(title: str) -> str:
    """The bash block of docs/api.md that follows the line ``<!-- go: TITLE -->``."""
    text = API_DOC.read_text(encoding="utf-8")
    found = re.search(rf"<!-- go: {re.escape(title)} -->\n```bash\n(.*?)```", text, re.S)
    assert found, f"docs/api.md has no Go block {title!r}"
    return found.group(1)


def _toolchain() -> None:
    """Skip (or, in CI, fail) when Debian's Go toolchain is not installed (scripts/setup.sh installs it in CI)."""
    missing = [t for t in TOOLS if shutil.which(t) is None] + [p for p in PACKAGES if not (GOCODE / p).is_dir()]
    if missing:
        why = f"the Go client test needs Debian's Go toolchain and packages; missing: {', '.join(missing)} " \
              "(scripts/setup.sh installs them in CI; see docs/api.md, \"Go\")"  # fmt: skip
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="session")
def go_client(clients_tmp: Path) -> Path:
    """Generate the stubs and build negt2i-go exactly as docs/api.md says; the binary's path."""
    _toolchain()
    gopath = clients_tmp / "go"
    env = {**os.environ, "GOPATH": f"{gopath}:/usr/share/gocode", "GO111MODULE": "off", "GOFLAGS": "",
           "CGO_ENABLED": "0"}  # fmt: skip
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    (gopath / "src").mkdir(parents=True, exist_ok=True)
    gen = subprocess.run(["bash", "-euo", "pipefail", "-c", doc_block("generate")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    package = gopath / "src" / "example.com" / "negt2i" / "negt2iv1"
    assert sorted(p.name for p in package.glob("*.go")) == [
        "common.pb.go", "evaluator.pb.go", "evaluator_grpc.pb.go", "stages.pb.go"
    ]  # fmt: skip
    shutil.copytree(GO_CLIENT, gopath / "src" / "example.com" / "negt2i" / "negt2i-go", dirs_exist_ok=True)
    build = subprocess.run(["bash", "-euo", "pipefail", "-c", doc_block("build")], cwd=gopath, env=env,
                           capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    binary = gopath / "bin" / "negt2i-go"
    assert binary.is_file()
    return binary


def _run(binary: Path, target: str, *args: str, timeout: float = 120.0) -> tuple[int, list[Any]]:
    proc = subprocess.run([str(binary), "-target", target, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip
    assert proc.returncode in (0, 1), f"negt2i-go {args} exited {proc.returncode}:\n{proc.stderr}"
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_go_reads_health_and_service_info(go_client: Path, clients_orchestrator: Proc):
    target = clients_orchestrator.target
    assert _run(go_client, target, "health") == (0, [{"status": "SERVING", "details": {}}])
    for stage in STAGES:
        assert _run(go_client, target, "health", f"negt2i.v1.Evaluator/stage/{stage}")[1][0]["status"] == "SERVING"
    rc, [unknown] = _run(go_client, target, "health", "no.such.Service")
    assert rc == 1 and unknown["error"]["code_name"] == "NotFound"
    rc, [info] = _run(go_client, target, "info")
    assert rc == 0
    with EvaluatorClient(target) as client:
        want = client.info()
    assert json_format.ParseDict(info, evaluator_pb2.ServiceInfo()) == want  # every field, from Go's stubs


def test_go_verdicts_match_the_python_client_and_negt2i_submit(
    go_client: Path, clients_orchestrator: Proc, demo_folder: Path, tmp_path: Path
):
    target = clients_orchestrator.target
    out = tmp_path / "submitted.jsonl"
    assert main(["submit", str(demo_folder), "--orchestrator", target, "--out", str(out), "--no-progress"]) == 0
    rows = {r["filename"]: r for r in map(json.loads, out.read_text().splitlines())}
    jobs = []
    for meta in sorted(demo_folder.glob("*/metadata.jsonl")):
        record = json.loads(meta.read_text().splitlines()[0])
        for image in sorted((meta.parent / "samples").glob("*.png")):
            jobs.append((str(image.relative_to(demo_folder)), image, record))
    requests = [make_request(p.read_bytes(), prompt=parse_prompt(r), request_id=n) for n, p, r in jobs]
    with EvaluatorClient(target) as client:
        python = {resp.request_id: resp.result.verdict for resp in client.stream(requests)}
    assert len(python) == len(rows) == 48
    for mode in ("evaluate", "stream"):
        rc, answers = _run(go_client, target, mode, str(demo_folder))
        assert rc == 0 and len(answers) == 48 and {a["request_id"] for a in answers} == set(rows), mode
        for answer in answers:
            name = answer["request_id"]
            got = json_format.ParseDict(answer["verdict"], evaluator_pb2.Verdict())
            assert got == python[name], (mode, name)
            row = rows[name]
            assert (got.prompt_id, got.correct, got.reason) == (row["prompt_id"], row["correct"], row["reason"])
    assert 0 < sum(r["correct"] for r in rows.values()) < 48  # both outcomes: agreement is not vacuous


def test_go_decodes_the_rich_error_details(go_client: Path, clients_orchestrator: Proc, demo_folder: Path,
                                          tmp_path: Path):  # fmt: skip
    folder = tmp_path / "bad"
    first = sorted(demo_folder.glob("*/metadata.jsonl"))[0]
    (folder / "00000" / "samples").mkdir(parents=True)
    (folder / "00000" / "metadata.jsonl").write_text(first.read_text())
    (folder / "00000" / "samples" / "0000.png").write_bytes(b"GIF89a not a png")
    for mode in ("evaluate", "stream"):
        rc, [answer] = _run(go_client, clients_orchestrator.target, mode, str(folder))
        error = answer["error"]
        assert rc == 1 and answer["request_id"] == "00000/samples/0000.png", mode
        assert error["code_name"] == "InvalidArgument" and error["domain"] == "negt2i.v1", mode
        assert error["reason"] and error["metadata"]["kind"] == "unreadable_image", (mode, error)
        assert error["violations"][0]["field"] == "image.data", (mode, error)
