"""The weights of the real perception models: a pinned table, a local cache, fetching and checking.

Weights live under one cache folder (``NEGT2I_WEIGHTS_DIR``, default
``~/.cache/negt2i/weights``; a read-only volume in Kubernetes), one sub-folder per
backend::

    rfdetr-seg-xl/rf-detr-seg-xlarge.pt
    sam2.1-hiera-small/sam2.1_hiera_small.pt
    siglip2-so400m-378/open_clip_config.json, open_clip_model.safetensors, tokenizer files
    depth-anything-v2-small/config.json, model.safetensors, preprocessor_config.json
    maskrcnn-r50/maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth    (the Appendix D ablation detector)

``negt2i weights fetch`` downloads them (Hugging Face Hub, or the publisher's URL
for RF-DETR and Mask R-CNN) and writes ``negt2i-weights.json`` in each folder: the
resolved revision and the SHA-256 and size of every file. Loading verifies the files
against that lock (and against the hashes this table knows: RF-DETR's MD5 from
the ``rfdetr`` package, the SHA-256 prefix torchvision puts in its file names).
Missing weights raise one ``WeightsMissingError`` that lists everything missing
and says how to fetch it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

LOCK_NAME: Final = "negt2i-weights.json"


class WeightsError(RuntimeError):
    """Weights are unusable (a hash mismatch, a broken lock file)."""


class WeightsFetchError(WeightsError):
    """Downloading failed (no network, ...); the message says what to do instead."""


class WeightsMissingError(WeightsError):
    """Weights are not in the cache; the message says how to fetch them."""


FETCH_INSTALL: Final = "pip install '.[fetch]'"
"""What installs the downloaders' packages (``huggingface_hub``): the ``fetch`` extra (README, "Install profiles")."""


def missing_module_help(module: str, names: Sequence[str]) -> str:
    """The message of a fetch that cannot start because this environment lacks ``module``: an installation
    problem, not a network one, so it says what to install (and nothing about working offline)."""
    return (
        f"{', '.join(names)}: fetching needs the Python package {module!r}, which this environment "
        f"({sys.executable}) lacks. Install it with `{FETCH_INSTALL}` (from the repository root; the `models` "
        "extra has it too), then run the command again. Nothing was downloaded."
    )


@dataclass(frozen=True)
class WeightsEntry:
    """One backend's weights: where they come from and which files must be present."""

    name: str
    """Backend registry name and sub-folder of the weights cache."""
    stage: str
    model: str
    source: str
    """``hf`` (Hugging Face Hub repository) or ``url``."""
    repo: str
    """Hugging Face repository id, or the download URL."""
    revision: str
    """Hugging Face revision to fetch (resolved to a commit and recorded in the lock)."""
    files: tuple[str, ...]
    """Files that must be present (relative to the sub-folder)."""
    main_file: str
    """The weights file whose hash ``ModelInfo.sha256`` reports."""
    extra_patterns: tuple[str, ...] = ()
    """Further files fetched when present in the repository (tokenizer files)."""
    md5: str = ""
    """Known MD5 of ``main_file`` (published by the model's package), checked when present."""
    sha256: str = ""
    """Known SHA-256 of ``main_file``, checked when present; otherwise the lock records it on fetch."""
    sha256_prefix: str = ""
    """Known leading hex digits of ``main_file``'s SHA-256 (torchvision publishes 8 in the file name,
    as ``torch.hub`` checks them), checked when present."""
    size_mb: int = 0
    """Approximate download size."""
    patterns: tuple[str, ...] = ()
    """Glob patterns of further repository files to fetch (a judge's weight shards, ``*.safetensors``)."""


WEIGHTS: Final[dict[str, WeightsEntry]] = {
    e.name: e
    for e in (
        WeightsEntry(
            name="rfdetr-seg-xl",
            stage="detector",
            model="RFDETRSegXLarge",
            source="url",
            repo="https://storage.googleapis.com/rfdetr/rf-detr-seg-xl-ft.pth",
            revision="rf-detr-seg-xl-ft",
            files=("rf-detr-seg-xlarge.pt",),
            main_file="rf-detr-seg-xlarge.pt",
            md5="3693b35d0eea86ebb3e0444f4a611fba",  # rfdetr.assets.model_weights (rfdetr 1.11.2)
            size_mb=150,
        ),
        WeightsEntry(
            name="sam2.1-hiera-small",
            stage="segmenter",
            model="facebook/sam2.1-hiera-small",
            source="hf",
            repo="facebook/sam2.1-hiera-small",
            revision="main",
            files=("sam2.1_hiera_small.pt",),
            main_file="sam2.1_hiera_small.pt",
            size_mb=185,
        ),
        WeightsEntry(
            name="siglip2-so400m-378",
            stage="attributes",
            model="ViT-SO400M-14-SigLIP2-378/webli",
            source="hf",
            repo="timm/ViT-SO400M-14-SigLIP2-378",
            revision="main",
            files=("open_clip_config.json", "open_clip_model.safetensors", "tokenizer_config.json"),
            main_file="open_clip_model.safetensors",
            extra_patterns=("tokenizer.json", "tokenizer.model", "special_tokens_map.json"),
            size_mb=4600,
        ),
        WeightsEntry(
            name="depth-anything-v2-small",
            stage="depth",
            model="depth-anything/Depth-Anything-V2-Small-hf",
            source="hf",
            repo="depth-anything/Depth-Anything-V2-Small-hf",
            revision="main",
            files=("config.json", "model.safetensors", "preprocessor_config.json"),
            main_file="model.safetensors",
            size_mb=100,
        ),
        WeightsEntry(
            name="maskrcnn-r50",
            stage="detector",
            model="maskrcnn_resnet50_fpn",
            source="url",
            repo="https://download.pytorch.org/models/maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth",
            revision="COCO_V1",
            files=("maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth",),
            main_file="maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth",
            sha256_prefix="bf2d0c1e",  # torchvision 0.29.1, MaskRCNN_ResNet50_FPN_Weights.COCO_V1 url
            size_mb=170,
        ),
    )
}
"""The paper's models (Table 15), then the ablation detector (Appendix D), by backend name."""


_HF_MODEL_FILES: Final = ("*.safetensors", "*.json", "*.txt", "*.jinja", "*.py", "tokenizer.model")
"""What a transformers judge needs from its repository: weight shards, configs, tokenizer, chat template."""


def _judge(name: str, repo: str, size_mb: int) -> WeightsEntry:
    return WeightsEntry(
        name=name,
        stage="judge",
        model=repo,
        source="hf",
        repo=repo,
        revision="main",
        files=("config.json", "model.safetensors.index.json", "tokenizer_config.json"),
        main_file="model.safetensors.index.json",
        size_mb=size_mb,
        patterns=_HF_MODEL_FILES,
    )


JUDGE_WEIGHTS: Final[dict[str, WeightsEntry]] = {
    e.name: e
    for e in (
        _judge("qwen2.5-vl-7b", "Qwen/Qwen2.5-VL-7B-Instruct", 16600),
        _judge("qwen3-vl-8b", "Qwen/Qwen3-VL-8B-Instruct", 17500),
        _judge("internvl3.5-8b", "OpenGVLab/InternVL3_5-8B-HF", 17000),
        _judge("internvl3-8b", "OpenGVLab/InternVL3-8B-hf", 16000),
        _judge("qwen3-vl-32b", "Qwen/Qwen3-VL-32B-Instruct", 66700),
        _judge("internvl3.5-38b", "OpenGVLab/InternVL3_5-38B-HF", 77000),
        WeightsEntry(
            name="clipscore-vit-b-32",
            stage="judge",
            model="ViT-B-32/openai",
            source="hf",
            repo="timm/vit_base_patch32_clip_224.openai",
            revision="main",
            files=("open_clip_config.json", "open_clip_model.safetensors"),
            main_file="open_clip_model.safetensors",
            size_mb=610,
        ),
        WeightsEntry(
            name="pickscore-v1",
            stage="judge",
            model="yuvalkirstain/PickScore_v1",
            source="hf",
            repo="yuvalkirstain/PickScore_v1",
            revision="main",
            files=("config.json", "model.safetensors"),
            main_file="model.safetensors",
            size_mb=3950,
        ),
        WeightsEntry(  # PickScore's model card loads its processor from the CLIP it was fine-tuned from
            name="pickscore-processor",
            stage="judge",
            model="laion/CLIP-ViT-H-14-laion2B-s32B-b79K (processor)",
            source="hf",
            repo="laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
            revision="main",
            files=("preprocessor_config.json", "tokenizer_config.json"),
            main_file="preprocessor_config.json",
            extra_patterns=("tokenizer.json", "vocab.json", "merges.txt", "special_tokens_map.json"),
            size_mb=5,
        ),
        WeightsEntry(  # no repository pinned: the user places and records it (docs/weights.md)
            name="negationclip",
            stage="judge",
            model="NegationCLIP (user-supplied transformers CLIPModel checkpoint)",
            source="local",
            repo="",
            revision="local",
            files=("config.json", "model.safetensors", "preprocessor_config.json", "tokenizer_config.json"),
            main_file="model.safetensors",
        ),
    )
}
"""The judges of the agreement study (Section 4, issue 23; ``negt2i judges list``), by judge name. Kept apart
from ``WEIGHTS`` (the evaluator's models): ``negt2i weights fetch NAME`` fetches one, ``--judges`` all of them,
and ``--all`` still means the evaluator's models only (the judges are ~260 GB)."""


def fetchable_judges() -> list[str]:
    """The judge entries ``negt2i weights fetch --judges`` downloads: all but those without a pinned repository."""
    return [n for n, e in JUDGE_WEIGHTS.items() if e.source != "local"]


def weights_dir(path: str | Path | None = None) -> Path:
    """The weights cache: ``path``, else ``NEGT2I_WEIGHTS_DIR``, else ``~/.cache/negt2i/weights``."""
    if path is not None and str(path) != "":
        return Path(path).expanduser()
    env = os.environ.get("NEGT2I_WEIGHTS_DIR", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "negt2i" / "weights"


def entry(name: str) -> WeightsEntry:
    """The table entry of a backend; the error lists the known names."""
    try:
        return WEIGHTS[name] if name in WEIGHTS else JUDGE_WEIGHTS[name]
    except KeyError:
        raise ValueError(f"no weights for {name!r}; known: {', '.join([*WEIGHTS, *JUDGE_WEIGHTS])}") from None


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 8 MiB blocks."""
    h = hashlib.new(algorithm)
    with path.open("rb") as fh:
        while block := fh.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def missing_files(e: WeightsEntry, root: Path) -> list[str]:
    """Required files of ``e`` absent from ``root / e.name``."""
    folder = root / e.name
    return [f for f in e.files if not (folder / f).is_file()]


def local_help(root: Path, name: str) -> str:
    """How to provide the weights of an entry without a pinned repository (``source="local"``)."""
    e = entry(name)
    return (
        f"{name} has no pinned repository: put a checkpoint ({', '.join(e.files)}) in {root / name}, then run "
        f"`negt2i weights record --dir {root} {name} --revision REV` (REV: the commit or release you took it from; "
        "docs/weights.md)"
    )


def _fetch_hint(root: Path, names: Sequence[str]) -> str:
    local = [n for n in names if entry(n).source == "local"]
    if local:
        rest = [n for n in names if n not in local]
        return "; ".join([*(local_help(root, n) for n in local), *([_fetch_hint(root, rest)] if rest else [])])
    command = f"negt2i weights fetch --dir {root} {' '.join(names)}"
    return f"run `{command}` (or set NEGT2I_WEIGHTS_DIR to a folder that has them). {offline_help(names)}"


def offline_help(names: Sequence[str]) -> str:
    """What to do without network: fetch elsewhere and copy the cache, or the synthetic offline run."""
    return (
        "Without network: on a connected machine run `negt2i weights fetch --dir DIR "
        f"{' '.join(names)}`, copy DIR here and set NEGT2I_WEIGHTS_DIR=DIR (or pass --weights-dir DIR). "
        "To try the whole pipeline offline without any weights: `negt2i evaluate IMAGES --out OUT --backend "
        'synthetic` (or `make evaluate IMAGES=... ARGS="--backend synthetic"`): drawn test scenes only, '
        "not for scoring real images."
    )


def needed(backends: Iterable[str]) -> list[str]:
    """The backends of ``backends`` that have weights (``synthetic`` and plug-in backends need none),
    in order, without repeats."""
    out: list[str] = []
    for name in backends:
        if name in WEIGHTS and name not in out:
            out.append(name)
    return out


def require(names: Iterable[str], path: str | Path | None = None) -> None:
    """Raise one ``WeightsMissingError`` naming every backend in ``names`` whose weights are missing.

    Names without an entry in ``WEIGHTS`` (``synthetic``, plug-in backends) need nothing.
    """
    root = weights_dir(path)
    missing: dict[str, list[str]] = {}
    for name in names:
        if name in WEIGHTS or name in JUDGE_WEIGHTS:
            gone = missing_files(entry(name), root)
            if gone:
                missing[name] = gone
    if missing:
        listing = "; ".join(f"{n} ({', '.join(f)})" for n, f in missing.items())
        raise WeightsMissingError(f"model weights missing in {root}: {listing}; {_fetch_hint(root, list(missing))}")


def read_lock(folder: Path) -> dict[str, Any] | None:
    """The lock of a weights folder, or None when there is none."""
    lock = folder / LOCK_NAME
    if not lock.is_file():
        return None
    try:
        data = json.loads(lock.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{lock} is unreadable ({exc}); fetch again with `negt2i weights fetch --force`") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise WeightsError(f"{lock} has no 'files' table; fetch again with `negt2i weights fetch --force`")
    return data


@dataclass(frozen=True)
class VerifiedWeights:
    """Where a backend's verified weights are, with the revision and hash to report in ``ModelInfo``."""

    folder: Path
    revision: str
    sha256: str
    verified: bool
    """False when no lock and no known hash could vouch for the files."""

    def path(self, name: str) -> Path:
        return self.folder / name


def verify(name: str, path: str | Path | None = None) -> VerifiedWeights:
    """Check a backend's weights before loading them: present, and matching the lock's SHA-256 (and
    the table's known hashes). Without a lock, the files are hashed and reported unverified."""
    e = entry(name)
    root = weights_dir(path)
    require([name], root)
    folder = root / e.name
    lock = read_lock(folder)
    main_sha = ""
    for rel in e.files if lock is None else sorted(set(e.files) | set(lock["files"])):
        file = folder / rel
        if not file.is_file():
            raise WeightsMissingError(f"{file} is listed in {LOCK_NAME} but missing; {_fetch_hint(root, [name])}")
        want = (lock or {}).get("files", {}).get(rel, {}).get("sha256", "")
        if rel == e.main_file:
            want = want or e.sha256
        if not want and rel != e.main_file:
            continue
        got = file_digest(file)
        if rel == e.main_file:
            main_sha = got
            if e.sha256 and got != e.sha256:
                raise WeightsError(f"{file}: SHA-256 {got} does not match the published {e.sha256}")
            if e.sha256_prefix and not got.startswith(e.sha256_prefix):
                raise WeightsError(f"{file}: SHA-256 {got} does not start with the published {e.sha256_prefix}")
            if e.md5 and file_digest(file, "md5") != e.md5:
                raise WeightsError(f"{file}: MD5 does not match the published {e.md5}; fetch again with --force")
        if want and got != want:
            raise WeightsError(
                f"{file}: SHA-256 {got} does not match {want} recorded when it was fetched; "
                f"fetch again with `negt2i weights fetch --force {name}`"
            )
    verified = lock is not None or bool(e.sha256 or e.md5)
    if not verified:
        print(f"warning: {folder} has no {LOCK_NAME}; its weights are unverified", file=sys.stderr)
    revision = str((lock or {}).get("revision") or e.revision)
    return VerifiedWeights(folder, revision, main_sha, verified)


# --------------------------------------------------------------------------- fetching


def record_lock(e: WeightsEntry, folder: Path, revision: str) -> str:
    """Check the files of ``e`` in ``folder`` (all present; the table's published hashes match) and write
    ``negt2i-weights.json``: the revision, and the SHA-256 and size of every file but hidden ones. Used by
    ``fetch`` and, for weights fetched by hand, ``negt2i weights record`` (docs/weights.md). Returns the
    main file's SHA-256."""
    name = e.name
    gone = [f for f in e.files if not (folder / f).is_file()]
    if gone:
        raise WeightsError(f"{name}: {folder} lacks {', '.join(gone)}")
    files: dict[str, dict[str, Any]] = {
        p.relative_to(folder).as_posix(): {"sha256": file_digest(p), "size": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    }
    main = str(files[e.main_file]["sha256"])
    if e.sha256 and main != e.sha256:
        raise WeightsError(f"{name}: SHA-256 {main} of {e.main_file} does not match the published {e.sha256}")
    if e.md5 and file_digest(folder / e.main_file, "md5") != e.md5:
        raise WeightsError(f"{name}: {e.main_file} does not match the published MD5 {e.md5}")
    if e.sha256_prefix and not main.startswith(e.sha256_prefix):
        raise WeightsError(
            f"{name}: SHA-256 {main} of {e.main_file} does not start with the published {e.sha256_prefix}"
        )
    lock = {
        "name": e.name,
        "model": e.model,
        "source": e.source,
        "repo": e.repo,
        "revision": revision,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    (folder / LOCK_NAME).write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")
    return main


Downloader = Callable[[WeightsEntry, Path], str]
"""Downloads an entry's files into a folder; returns the resolved revision."""


def _download_hf(e: WeightsEntry, folder: Path) -> str:
    from huggingface_hub import HfApi, hf_hub_download

    info = HfApi().model_info(e.repo, revision=e.revision)
    revision = str(info.sha or e.revision)
    available = {s.rfilename for s in (info.siblings or [])}
    wanted = list(e.files) + [f for f in e.extra_patterns if f in available]
    wanted += sorted(f for f in available if f not in wanted and any(fnmatch.fnmatch(f, p) for p in e.patterns))
    for rel in wanted:
        hf_hub_download(e.repo, rel, revision=revision, local_dir=folder)
    return revision


def _download_url(e: WeightsEntry, folder: Path, *, progress: bool = True) -> str:
    import httpx
    from tqdm import tqdm

    target = folder / e.main_file
    with httpx.stream("GET", e.repo, follow_redirects=True, timeout=60.0) as response:
        response.raise_for_status()
        total = int(response.headers.get("content-length") or 0) or None
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=e.name, disable=not progress)
        with target.open("wb") as fh, bar:
            for block in response.iter_bytes(1 << 20):
                fh.write(block)
                bar.update(len(block))
    return e.revision


def download(e: WeightsEntry, folder: Path) -> str:
    """The default downloader: Hugging Face Hub (its own progress bars) or a plain URL (a progress bar)."""
    return _download_hf(e, folder) if e.source == "hf" else _download_url(e, folder)


def fetch(
    names: Sequence[str] | None = None,
    path: str | Path | None = None,
    *,
    force: bool = False,
    downloader: Downloader = download,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Download weights (all of ``WEIGHTS`` by default) into the cache and write their locks.

    Files are downloaded into a temporary folder next to the target and moved in
    place only when complete and verified against the table's known hashes, so an
    interrupted fetch leaves no half-written weights. Present, verified weights are
    kept unless ``force``. With the default downloader, a missing ``huggingface_hub`` (the core
    install has none) is one error saying what to install, before anything is downloaded.
    """
    root = weights_dir(path)
    todo = list(names or WEIGHTS)
    if downloader is download:  # before anything is created or downloaded: the downloaders' packages are here
        hub = [n for n in todo if entry(n).source == "hf" and (force or _absent(entry(n), root))]
        if hub and importlib.util.find_spec("huggingface_hub") is None:
            raise WeightsFetchError(missing_module_help("huggingface_hub", hub))
    root.mkdir(parents=True, exist_ok=True)
    done: list[Path] = []
    for name in todo:
        e = entry(name)
        if e.source == "local":
            raise WeightsError(local_help(root, name))
        folder = root / e.name
        if not force and not _absent(e, root):
            verify(name, root)
            log(f"{name}: present and verified in {folder}")
            done.append(folder)
            continue
        log(f"{name}: fetching {e.repo} ({e.revision}, about {e.size_mb} MB) ...")
        tmp = Path(tempfile.mkdtemp(prefix=f".{e.name}-", dir=root))
        try:
            try:
                revision = downloader(e, tmp)
            except (WeightsError, KeyboardInterrupt):
                raise
            except ModuleNotFoundError as exc:  # this environment, not the network: say what to install
                raise WeightsFetchError(missing_module_help(exc.name or str(exc), [name])) from None
            except Exception as exc:  # no network, a proxy, a hub error: many types, one clear message
                raise WeightsFetchError(
                    f"{name}: could not download {e.repo} ({type(exc).__name__}: {exc}). {offline_help(todo)}"
                ) from None
            main = record_lock(e, tmp, revision)
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        log(f"{name}: ok ({revision}, sha256 {main[:16]}...) in {folder}")
        done.append(folder)
    return done


def _absent(e: WeightsEntry, root: Path) -> bool:
    """Whether ``fetch`` downloads ``e`` (files or lock missing), judged without hashing anything."""
    return bool(missing_files(e, root)) or read_lock(root / e.name) is None


def status(name: str, path: str | Path | None = None) -> str:
    """``missing``, ``unverified`` (no lock), ``ok`` or ``mismatch: ...`` for ``negt2i weights list``."""
    root = weights_dir(path)
    e = entry(name)
    if missing_files(e, root):
        return "missing"
    try:
        lock = read_lock(root / e.name)
        if lock is None:
            return "unverified (no lock; fetch to record hashes)"
        verify(name, root)
    except WeightsError as exc:
        return f"mismatch: {exc}"
    return "ok"
