"""The command line as a new user meets it: offline and first-run messages, `weights fetch` for the backends in
use (with a progress bar), a closed pipe, --device, exit codes for a missing input, the README's Python
snippet, and `evaluate --shard`."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from negt2i import weights
from negt2i.cli import build_parser, main
from negt2i.cli.weights_cmd import fetch_names
from negt2i.core.results import read_results
from negt2i.stages.demo_data import write_demo
from tests.services.live import free_port

REPO = Path(__file__).resolve().parents[1]
PAPER = ["rfdetr-seg-xl", "sam2.1-hiera-small", "siglip2-so400m-378", "depth-anything-v2-small"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEGT2I_") and "proxy" not in k.lower()}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _offline_env() -> dict[str, str]:
    """Every HTTP(S) request goes to a closed local port, as on a machine without network."""
    dead = f"http://127.0.0.1:{free_port()}"
    return _env(HTTPS_PROXY=dead, HTTP_PROXY=dead, https_proxy=dead, http_proxy=dead, HF_ENDPOINT=dead,
                HF_HUB_DISABLE_TELEMETRY="1")  # fmt: skip


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    write_demo(root, prompts=6, samples=2, seed=1, size=64)
    return root


# --------------------------------------------------------------------------- 6. offline, first run, weights fetch


def test_offline_main_job_fails_at_once_and_says_what_to_do(demo: Path, tmp_path: Path):
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "negt2i", "evaluate", str(demo), "--out", str(out), "--fetch-weights",
           "--weights-dir", str(tmp_path / "w"), "--no-progress"]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=_offline_env(), capture_output=True, text=True, timeout=120, check=False)
    assert time.monotonic() - start < 60
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1
    assert "rfdetr-seg-xl: could not download" in done.stderr
    assert "set NEGT2I_WEIGHTS_DIR=DIR" in done.stderr and "--backend synthetic" in done.stderr
    assert f"negt2i weights fetch --dir DIR {' '.join(PAPER)}" in done.stderr
    assert "maskrcnn" not in done.stdout + done.stderr  # the ablation detector is not part of the main job
    assert not out.exists()


def test_the_offline_synthetic_run_fetches_nothing(demo: Path, tmp_path: Path):
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "negt2i", "evaluate", str(demo), "--out", str(out), "--fetch-weights",
           "--backend", "synthetic", "--weights-dir", str(tmp_path / "w"), "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=_offline_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert len(list(read_results(out))) == 12


def _fetch_args(*argv: str):
    return build_parser().parse_args(["weights", "fetch", *argv])


def test_weights_fetch_takes_only_the_backends_in_use(monkeypatch):
    for stage in ("DETECTOR", "SEGMENTER", "ATTRIBUTES", "DEPTH"):
        monkeypatch.delenv(f"NEGT2I_{stage}_BACKEND", raising=False)
    assert fetch_names(_fetch_args()) == PAPER
    assert fetch_names(_fetch_args("--backend", "synthetic")) == []
    assert fetch_names(_fetch_args("--backend", "synthetic", "--detector", "maskrcnn-r50")) == ["maskrcnn-r50"]
    assert fetch_names(_fetch_args("--detector", "maskrcnn-r50")) == ["maskrcnn-r50", *PAPER[1:]]
    assert fetch_names(_fetch_args("--all")) == list(weights.WEIGHTS)
    assert fetch_names(_fetch_args("sam2.1-hiera-small")) == ["sam2.1-hiera-small"]
    monkeypatch.setenv("NEGT2I_DEPTH_BACKEND", "synthetic")
    assert fetch_names(_fetch_args()) == PAPER[:3]


def test_weights_fetch_for_synthetic_backends_has_nothing_to_do(capsys):
    assert main(["weights", "fetch", "--backend", "synthetic"]) == 0
    assert "nothing to fetch" in capsys.readouterr().out


@pytest.fixture
def weights_server(tmp_path: Path) -> Iterator[str]:
    payload = os.urandom(3 << 20)
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "model.pt").write_bytes(payload)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(tmp_path / "srv"), **k)

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/model.pt"
    finally:
        server.shutdown()


def test_weights_fetch_shows_a_progress_bar(weights_server: str, tmp_path: Path, monkeypatch, capsys):
    entry = weights.WeightsEntry(name="local-model", stage="detector", model="m", source="url", repo=weights_server,
                                 revision="v1", files=("model.pt",), main_file="model.pt", size_mb=3)  # fmt: skip
    monkeypatch.setitem(weights.WEIGHTS, entry.name, entry)
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    assert main(["weights", "fetch", "local-model", "--dir", str(tmp_path / "w")]) == 0
    err = capsys.readouterr().err
    assert "local-model" in err and "100%" in err and re.search(r"3\.00M", err)
    assert (tmp_path / "w" / "local-model" / "model.pt").stat().st_size == 3 << 20


def test_weights_fetch_without_huggingface_hub_says_what_to_install(tmp_path: Path, monkeypatch, capsys):
    """The core profile (`pip install .`) has no huggingface_hub: an installation problem, not a network one. The
    message names the fix, blames no network, and nothing is created or downloaded (issue 45)."""
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not importable, as in the core profile
    root = tmp_path / "w"
    assert main(["weights", "fetch", "sam2.1-hiera-small", "depth-anything-v2-small", "--dir", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert "sam2.1-hiera-small, depth-anything-v2-small: fetching needs the Python package 'huggingface_hub'" in err
    assert "pip install '.[fetch]'" in err and "Nothing was downloaded" in err
    assert "could not download" not in err and "Without network" not in err
    assert not root.exists()


def test_submit_ends_with_its_results_line_and_a_summary_of_one_says_one(tmp_path: Path, capsys):
    """`negt2i submit` ends as `negt2i evaluate` and `negt2i generate` do, with `results: PATH`; counts of one are in
    the singular ("1 image", "1 error", "1 prompt") in every summary line (issue 45)."""
    pytest.importorskip("grpc_health")
    from tests.services.standin import SlowStandIn

    root = tmp_path / "demo"
    write_demo(root, prompts=1, samples=1, seed=1, size=64)
    standin = SlowStandIn(0.0)
    out = tmp_path / "r.jsonl"
    try:
        argv = ["submit", str(root), "--orchestrator", standin.target, "--out", str(out), "--no-progress"]
        assert main([*argv, "--wait", "20"]) == 0
    finally:
        standin.stop()
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "1 image evaluated (0 already done, 1 in this run)",
        "results file: 1 image: 0 judged, 1 error (invalid_metadata 1); image accuracy 0.0%, prompt accuracy 0.0% "
        "(1 prompt; 0/1 image correct; errors count as incorrect)",
        f"results: {out}",
    ]
    assert main(["evaluate", str(root), "--out", str(tmp_path / "e.jsonl"), "--backend", "synthetic",
                 "--no-progress"]) == 0  # fmt: skip
    assert capsys.readouterr().out.splitlines()[0] == "1 image evaluated (0 already done, 1 in this run)"
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--no-plots", "--bootstrap", "10"]) == 0
    assert "r: 1 image: 0 judged, 1 error (invalid_metadata 1)" in capsys.readouterr().out


# --------------------------------------------------------------------------- 7. CLI polish


def test_a_closed_pipe_is_not_a_traceback():
    proc = subprocess.Popen([sys.executable, "-m", "negt2i", "rules", "current"], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the reader goes away before anything is written (`negt2i ... | head -0`)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err
    assert proc.returncode == 141


def test_piped_to_head_prints_no_error(tmp_path: Path):
    corpus = REPO / "data" / "negt2ibench.jsonl"
    done = subprocess.run(f"{sys.executable} -m negt2i corpus stats --json {corpus} | head -c 10", shell=True,
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert len(done.stdout) == 10 and "Traceback" not in done.stderr and "Error" not in done.stderr


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CPU"])
def test_device_is_validated_for_every_backend(demo: Path, tmp_path: Path, capsys, device: str):
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", str(demo), "--out", str(tmp_path / "r.jsonl"), "--backend", "synthetic", "--device", device])
    assert exit_.value.code == 2
    assert f"unknown device '{device}'" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "{missing}", "--out", "{tmp}/o.jsonl", "--backend", "synthetic"],
        ["submit", "{missing}", "--out", "{tmp}/o.jsonl"],
        ["report", "{missing}", "--out", "{tmp}/rep"],
        ["report", "A={tmp}/none-*.jsonl", "--out", "{tmp}/rep"],
        ["agreement", "--labels", "{missing}", "--results", "{missing}", "--out", "{tmp}/ag"],
        ["prompts", "check", "{missing}"],
        ["corpus", "validate", "{missing}"],
        ["corpus", "stats", "{missing}"],
        ["rules", "{missing}"],
    ],
)
def test_a_missing_input_is_exit_code_2_everywhere(tmp_path: Path, capsys, argv: list[str]):
    args = [a.format(missing=tmp_path / "absent.jsonl", tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err


def test_the_readme_python_snippet_runs_as_written(tmp_path: Path):
    readme = (REPO / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert snippets, "the README has a Python snippet"
    for code in snippets:
        script = tmp_path / "snippet.py"
        script.write_text(code)
        done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=_env(), capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1].startswith("True")


@pytest.mark.slow
def test_the_readme_top_says_where_images_come_from_without_a_generator_and_it_runs(tmp_path: Path):
    """Next to the two commands, the README says how to get images without a generator (the demo data), and those
    commands run as written, in an empty folder (`make evaluate ...` as the Makefile runs it) (issue 45, item 3)."""
    readme = (REPO / "README.md").read_text()
    top = readme[readme.index("## Set-up and the two commands") : readme.index("### Install profiles")]
    blocks = re.findall(r"```bash\n(.*?)```", top, flags=re.S)
    demo = next(b for b in blocks if "negt2i.stages.demo_data" in b)
    commands = [line.split("  #")[0].strip() for line in demo.strip().splitlines()]
    assert [c.split()[0] for c in commands] == [".venv/bin/python", "make", ".venv/bin/negt2i"]
    make = re.fullmatch(r'make evaluate IMAGES=(\S+) OUT=(\S+) ARGS="([^"]*)"', commands[1])
    assert make is not None, commands[1]
    argvs = [
        [sys.executable, *commands[0].split()[1:]],
        [sys.executable, "-m", "negt2i", "evaluate", make[1], "--out", make[2], "--fetch-weights", *make[3].split(),
         "--no-progress"],
        [sys.executable, "-m", "negt2i", *commands[2].split()[1:]],
    ]  # fmt: skip
    for argv in argvs:
        done = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
    assert len(list(read_results(tmp_path / "demo.jsonl"))) == 192
    assert (tmp_path / "demo-report" / "report.html").is_file()


def test_evaluate_shards_partition_the_jobs_and_merge_into_the_full_file(demo: Path, tmp_path: Path, capsys):
    full = tmp_path / "full.jsonl"
    base = ["evaluate", str(demo), "--backend", "synthetic", "--no-progress"]
    assert main([*base, "--out", str(full)]) == 0
    shards = [tmp_path / f"shard-{i}.jsonl" for i in range(3)]
    for i, shard in enumerate(shards):
        assert main([*base, "--out", str(shard), "--shard", f"{i}/3"]) == 0
    lines = [set(s.read_text().splitlines()) for s in shards]
    assert [len(x) for x in lines] == [4, 4, 4]
    assert set().union(*lines) == set(full.read_text().splitlines())
    capsys.readouterr()
    assert main(["report", f"m={tmp_path}/shard-*.jsonl", "--out", str(tmp_path / "a"), "--no-plots"]) == 0
    merged = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("m: ")]
    assert main(["report", f"m={full}", "--out", str(tmp_path / "b"), "--no-plots"]) == 0
    assert merged == [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("m: ")]
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "x.jsonl"), "--shard", "3/3"])
