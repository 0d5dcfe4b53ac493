"""Every benchmark in ``benchmarks/`` runs in CI: each script's ``--smoke`` mode (seconds, no GPU, no network:
small sizes, synthetic or tiny random-weight models, the stage services from one light process) runs as a real
subprocess of this tree, and must exit 0 and print its figure line in the format its docstring documents,
beside the ``machine:`` line every CPU figure is stated with. Figures are never asserted: a smoke run only
shows that the script still works (a benchmark nobody runs rots: ``bench_cpu_path.py`` did, issue 44).

A new script in ``benchmarks/`` must be added to ``SMOKE`` (or, if it is a helper module, to ``HELPERS``):
``test_every_script_is_listed`` fails until it is.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

NUMBER = r"[\d.]+"
MACHINE = rf"^machine: .+, \d+ CPUs, load average {NUMBER} {NUMBER} {NUMBER}$"
"""``benchmarks/machine.py``'s ``describe()``."""

HELPERS = {
    "kstub_backends.py": "a detector stub registered as a backend (bench_services.py --k)",
    "machine.py": "the machine line and the reference workload the CPU ratios divide by",
    "random_backends.py": "the paper's architectures with random weights, registered as backends (bench_services.py)",
}
"""Modules in ``benchmarks/`` that other scripts import: not benchmarks, no smoke mode."""


@dataclass(frozen=True)
class Smoke:
    """How a script's smoke run is started and what it must print (each pattern searched line by line)."""

    args: tuple[str, ...] = ("--smoke",)
    figures: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    """Modules the script imports (the test is skipped without them; CI installs them all)."""
    machine: bool = True
    """Whether it prints the ``machine:`` line (a script that measures nothing does not)."""


TORCH_STAGES = ("torch", "rfdetr", "sam2", "open_clip", "transformers")

SMOKE: dict[str, Smoke] = {
    "bench_calibrate.py": Smoke(
        figures=(rf"^full \(every statement\)\s+{NUMBER} candidates/s\s+\d+ images/s$",),
    ),
    "bench_cost.py": Smoke(
        figures=(
            rf"^NegT2IBench on cpu: 2 images, {NUMBER} s/img \(median {NUMBER}\), load {NUMBER} s, GPU GiB -, "
            rf"RSS GiB {NUMBER}, params -$",
        ),
    ),
    "bench_cpu_path.py": Smoke(
        figures=(
            rf"^cpu path per image \(1024 px, K=300\): median {NUMBER} x reference \(goal <= {NUMBER}\); for "
            rf"information {NUMBER} ms, reference {NUMBER} ms, RF-DETR's transform \(on the GPU in production\) "
            rf"{NUMBER} ms more$",
        ),
        needs=TORCH_STAGES,
    ),
    "bench_generate.py": Smoke(
        figures=(rf"^{NUMBER} s/image, {NUMBER} images/s, {NUMBER} s per image-step$",),
        needs=("torch", "diffusers", "transformers"),
    ),
    "bench_health_latency.py": Smoke(
        figures=(r"^health latency: median \d+ ms, p90 \d+ ms, max \d+ ms over \d+ checks$",),
        needs=("grpc",),
    ),
    "bench_judge.py": Smoke(
        figures=(
            rf"^depth\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$",
            rf"^slowest: \w+ {NUMBER} x reference \(goal <= {NUMBER}\); for information {NUMBER} ms CPU, reference "
            rf"{NUMBER} ms; machine: ",
        ),
    ),
    "bench_masks.py": Smoke(
        figures=(rf"^postprocess  opencv\s+{NUMBER}$", rf"^rle decode   negt2i.core.rle\s+{NUMBER}$"),
        needs=("pycocotools", "scipy", "cv2"),
    ),
    "bench_memory.py": Smoke(
        figures=(rf"^throughput\s+after\s+{NUMBER}\s+\(", r"^streams\s+after\s+-?\d+\s+-?\d+\s+\d+"),
        needs=("grpc",),
    ),
    "bench_overload.py": Smoke(
        figures=(
            rf"^2 concurrent negt2i submit runs of 2 images each, {NUMBER} s \({NUMBER} images/s\)$",
            r"^  items ok 4 \(of 4\), error lines 0, retried \d+, failed 0$",
        ),
        needs=("grpc", "psutil"),
    ),
    "bench_pipeline.py": Smoke(
        figures=(rf"^pipeline\s+{NUMBER}\s+{NUMBER}  color / directional / depth prompts in turn$",),
        needs=TORCH_STAGES,
    ),
    "bench_resume.py": Smoke(
        figures=(rf"^hashing 8 images \({NUMBER} MB\): {NUMBER} s \(\d+ MB/s\)$",),
    ),
    "bench_reward.py": Smoke(
        figures=(rf"^  client\(bytes\)\s+p50\s+{NUMBER} ms\s+p99\s+{NUMBER} ms\s+{NUMBER} images/s\s+x bare: ",),
        needs=("grpc",),
    ),
    "bench_services.py": Smoke(
        figures=(rf"^ratio services / embedded \(auto\): {NUMBER}x ",),
        needs=("grpc",),
    ),
    "bench_stage_refusal.py": Smoke(
        figures=(
            rf"^refused \(\d+\): median {NUMBER} ms, p90 {NUMBER} ms, max {NUMBER} ms$",
            rf"^admitted \(\d+, held until the refusals were in\): median {NUMBER} ms, p90 {NUMBER} ms, "
            rf"max {NUMBER} ms$",
        ),
        needs=("bentoml",),
    ),
    "bench_stage_transport.py": Smoke(
        figures=(
            rf"^all four stages \(K=20\): orchestrator json {NUMBER} ms vs protobuf {NUMBER} ms per image; "
            rf"services json {NUMBER} ms vs protobuf {NUMBER} ms$",
        ),
    ),
    "bench_workers.py": Smoke(
        figures=(
            rf"^workers 1: {NUMBER} images/s \({NUMBER} s; stub model time ",
            r"^results files identical across runs: yes$",
        ),
    ),
    "fuzz_decoder.py": Smoke(
        figures=(rf"^mutants: 200 \(seed 1\) in {NUMBER} s, \d+ per s$", r"^images: \d+  ImageError: \d+  escaped: 0$"),
    ),
    "gpu_check.py": Smoke(
        args=("--smoke", "--device", "cpu"),
        figures=(
            *(
                rf"^{stage}\s+{dtype}(\s+{NUMBER})+ GiB"  # images/s per batch size, then the peak memory
                for stage in ("detector", "segmenter", "attributes", "depth")
                for dtype in ("fp32", "bf16")
            ),
            *(rf"^  {stage}\s+bf16\s+\S" for stage in ("detector", "segmenter", "attributes", "depth")),
            r"K \(raw detections >= 0.005 per image\): min \d+ median [\d.]+ max \d+",
            rf"^full pipeline, fp32, 2 images: {NUMBER} images/s$",
        ),
        needs=TORCH_STAGES,
    ),
    "k8s_sizing.py": Smoke(
        figures=(
            rf"^estimated GPU seconds per image: detector {NUMBER}, segmenter {NUMBER}, attributes {NUMBER}, "
            rf"depth {NUMBER}$",
            r"^\| gpu \| \d+ GPUs? ",
        ),
        needs=("yaml",),
        machine=False,
    ),
    "template_agreement.py": Smoke(
        figures=(rf"^image verdicts that differ \(single vs geneval templates\): \d+ of \d+ \({NUMBER}%\)$",),
        needs=("torch", "open_clip"),
    ),
}


def test_every_script_is_listed() -> None:
    """Each file in benchmarks/ is a benchmark with a smoke run here, or a helper module named in ``HELPERS``."""
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts == SMOKE.keys() | HELPERS.keys(), {
        "not listed": sorted(scripts - SMOKE.keys() - HELPERS.keys()),
        "listed but gone": sorted((SMOKE.keys() | HELPERS.keys()) - scripts),
    }
    assert not SMOKE.keys() & HELPERS.keys()


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_smoke_run_prints_its_figures(script: str) -> None:
    smoke = SMOKE[script]
    for module in smoke.needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{script} needs {module}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *smoke.args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"{script} exited {done.returncode}\n{out[-3000:]}\n{done.stderr[-5000:]}"
    if smoke.machine:
        assert re.search(MACHINE, out, re.M), out
    for pattern in smoke.figures:
        assert re.search(pattern, out, re.M), f"{script}: no line matches {pattern!r}\n{out[-4000:]}"
