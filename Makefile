# One obvious way to run things. `make test` and the main job set up .venv/ themselves.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test test-pythons test-latest lock lint typecheck unit report-sample bench bench-pipeline evaluate weights clean protos protos-dist

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

# requirements.lock, the one lock of exact versions (with hashes) that setup, test-pythons, the images and the
# README's "tested versions" install: regenerated from pyproject.toml, keeping the locked versions it still
# allows; UPGRADE=1 takes the newest (run `make test-latest` first). docs/dependencies.md.
lock:
	@scripts/lock.sh

# The README's test command in a throwaway .venv-latest/ with the newest versions pyproject.toml allows (not
# the lock's); not part of CI. Record the result in docs/dependencies.md.
test-latest: setup
	@scripts/test_latest.sh

# The pure core's smoke subset on Python 3.12 and 3.13 (.venv-3.12/, .venv-3.13/; no torch); CI runs it after
# `make test`. PYTHONS="3.13" picks versions.
test-pythons:
	@scripts/smoke_pythons.sh

# Regenerate the committed sample report (docs/report-sample/); tests/metrics/test_report_sample.py checks it.
report-sample: setup
	$(BIN)/python -m negt2i.metrics.sample docs/report-sample

# Regenerate the Python stubs (negt2i/wire/v1) and the JSON Schemas (protos/negt2i/v1/schemas) from
# protos/, and lint the protos; tests/protos fails while committed files and protos/ disagree.
protos: setup
	PYTHON=$(BIN)/python scripts/gen_protos.sh

# The protos as one versioned artefact, dist/negt2i-protos-<version>.tar.gz (docs/api.md); its one
# folder, negt2i-protos-<version>/, is the include root (protos/ here).
protos-dist: setup
	$(BIN)/python scripts/protos/dist.py --out dist

bench: setup
	$(BIN)/python benchmarks/bench_judge.py

# Per-stage and full-pipeline images/s on CPU with the real architectures (random weights; minutes).
bench-pipeline: setup
	$(BIN)/python benchmarks/bench_pipeline.py

# The main job: judge generated images (GenEval layout folder or JSONL manifest), resumable.
#   make evaluate IMAGES=path/to/images OUT=results.jsonl [ARGS="--device cuda --limit 100"]
# Missing weights of the backends the run uses are fetched first (--fetch-weights; none for
# ARGS="--backend synthetic", which runs offline); FETCH=0 never fetches.
OUT ?= results.jsonl
ARGS ?=
FETCH ?= 1
evaluate: setup
	@test -n "$(IMAGES)" || { echo "usage: make evaluate IMAGES=folder-or-manifest [OUT=results.jsonl] [ARGS=...]" >&2; exit 2; }
	$(BIN)/negt2i evaluate "$(IMAGES)" --out "$(OUT)" $(if $(filter 0,$(FETCH)),,--fetch-weights) $(ARGS)

# Download the four models' weights into NEGT2I_WEIGHTS_DIR (default ~/.cache/negt2i/weights);
# `negt2i weights fetch --all` adds the Mask R-CNN ablation detector.
weights: setup
	$(BIN)/negt2i weights fetch

clean:
	rm -rf $(VENV) .venv-latest build/uv .mypy_cache .ruff_cache .pytest_cache

# Container images and Kubernetes (docs/deployment.md). Images need Docker with BuildKit;
# the build context is the repository root. Registry and tag: ONE place, the release
# component k8s/components/release/kustomization.yaml, which the manifests run:
#   make k8s REGISTRY=ghcr.io/me TAG=0.1.0    rewrite it and re-render k8s/*.yaml, k8s/swap/
#   make images && make push                   build and push exactly those names
# REGISTRY and TAG default to the release component's values (never `latest`).
RELEASE := k8s/components/release/kustomization.yaml
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
REGISTRY ?= $(shell sed -n 's|^ *newName: *\(.*\)/orchestrator *$$|\1|p' $(RELEASE))
TAG ?= $(shell sed -n 's|^ *newTag: *\([^ ]*\) *$$|\1|p' $(RELEASE) | head -n 1)
STAGES := detector segmenter attributes depth
IMAGE_TARGETS := $(addprefix image-,$(STAGES) orchestrator)
DOCKER_BUILD = DOCKER_BUILDKIT=1 docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION)

.PHONY: images push $(IMAGE_TARGETS) image-generate k8s k8s-render k8s-test container-test container-test-kube

images: $(IMAGE_TARGETS)

# One Dockerfile for the four stage images, one build target per stage (--target detector ...);
# the targets share every layer but their metadata. Base images and mirrors: BUILD_ARGS, e.g.
#   make images BUILD_ARGS="--build-arg CUDA_IMAGE=mirror.example/nvidia/cuda:13.0.1-base-ubuntu22.04"
# (docs/deployment.md: air-gapped and mirrored registries).
BUILD_ARGS ?=
$(addprefix image-,$(STAGES)): image-%:
	$(DOCKER_BUILD) $(BUILD_ARGS) -f services/Dockerfile --target $* -t $(REGISTRY)/$*:$(TAG) .

image-orchestrator:
	$(DOCKER_BUILD) $(BUILD_ARGS) -f orchestrator/Dockerfile -t $(REGISTRY)/orchestrator:$(TAG) .

push:
	@for i in $(STAGES) orchestrator; do docker push $(REGISTRY)/$$i:$(TAG) || exit 1; done

# The plain manifests `kubectl apply -f k8s/` reads (k8s/negt2i.yaml) and the swap files
# (k8s/swap/), rendered from the kustomize sources; REGISTRY/TAG go through the release
# component. tests/k8s fail while rendered files and sources disagree.
k8s: setup
	$(BIN)/python scripts/render_k8s.py --registry "$(REGISTRY)" --tag "$(TAG)"

# The generation runner (k8s/jobs/generate, docs/generate.md); not part of `make images`.
image-generate:
	$(DOCKER_BUILD) $(BUILD_ARGS) -f docker/generate.Dockerfile -t $(REGISTRY)/generate:$(TAG) .

# Render every overlay and Job to build/k8s/ (ignored) for review or `kubectl diff -f`.
k8s-render: setup
	@mkdir -p build/k8s
	@for d in k8s/overlays/*/ k8s/jobs/*/; do \
		out=build/k8s/$$(echo $${d#k8s/} | tr / - | sed 's/-$$//').yaml; \
		$(BIN)/kubectl kustomize $$d > $$out && echo $$out || exit 1; \
	done

# The stack in its own images (docs/deployment.md "Container tests"): builds the stage and orchestrator
# images with the targets above through `docker` (Docker, or podman's docker shim: DOCKER=podman also
# works), runs them on a private network (read-only roots, uid 10001), checks parity with `negt2i
# evaluate` and two detector swaps, and removes what it created. Not part of `make test`: the builds
# take minutes and ~7 GB per stage image. KEEP_IMAGES=1 keeps the images for a faster rerun.
container-test: setup
	$(BIN)/python -m tests.containers.stack

# The manifests themselves (k8s/overlays/cpu-dev, k8s/jobs/sweep) through `podman kube play` with a test
# overlay: synthetic backends, a 127.0.0.1 host port per Deployment, network aliases for the Services, the
# sweep and report Jobs as pods; parity again, for the host's submit and for the sweep's shards and report.
# Needs podman 4.3 or newer. KEEP_IMAGES=1 keeps the images.
container-test-kube: setup
	$(BIN)/python -m tests.containers.kube

# Render + strict schema validation + policies + hadolint (also part of `make unit`).
k8s-test: setup
	$(BIN)/pytest -q tests/k8s
