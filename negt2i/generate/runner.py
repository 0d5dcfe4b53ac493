"""The generation run: prompts x seeds -> GenEval layout, resumable, with provenance beside every sample.

Layout of ``OUT`` (GenEval's, readable by ``negt2i evaluate OUT``)::

    OUT/.negt2i-generate.json          the run: settings (ModelSpec) + digest, seeds, prompts digest
    OUT/00000/metadata.jsonl           the prompt record (one line), folder = 0-based prompt index
    OUT/00000/samples/0000.png         sample k = seed seeds[k]
    OUT/00000/provenance/0000.json     how that sample was made (model, revision, pipeline, scheduler,
                                       steps, guidance, resolution, seed, dtype, device, batch size,
                                       library versions, SHA-256 of the PNG)

Sharding is by prompt (prompt i belongs to shard ``i % N``), after ``--limit``
takes the first prompts, so a prompt folder is written by exactly one shard.

Resume: a sample is done when its PNG's SHA-256 equals the one recorded in its
provenance, and that provenance names this run's settings digest, seed and
prompt. A PNG without valid provenance (a crash between the two renames) is
regenerated; files are written under a hidden temporary name and renamed, so a
partial file never has the final name. A folder whose run file names other
settings, seeds or prompts, a folder with files this command did not write, or a
sample whose provenance names other settings, is refused, never mixed.

Determinism: sample k's initial noise comes from its own CPU ``torch.Generator``
seeded with ``seeds[k]``. The last batch of a run is padded to the full batch size
(padding images are dropped), so every pipeline call has the same shape and a
sample's pixels do not depend on its shard, ``--limit`` or resume point. Across
*different* batch sizes, batched float kernels may round differently in the last
bit: images then agree to +-1 grey level in rare pixels (tests/generate).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import platform
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, Protocol

from negt2i.core.files import open_regular, read_regular
from negt2i.core.spec import Prompt, dumps_prompt
from negt2i.generate.presets import DEFAULT_SEEDS, ModelSpec
from negt2i.generate.registry import GenerateError, Generator, create, preflight

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from negt2i.run.jobs import Job

RUN_FILE: Final = ".negt2i-generate.json"
"""The run record at the root of the output folder (hidden: ``negt2i evaluate`` ignores it)."""
_OURS: Final = ".negt2i-generate"
"""Prefix of every file this command writes at the root (run file, its temporary, shard locks)."""
VERSIONED: Final[tuple[str, ...]] = ("negt2ibench", "torch", "diffusers", "transformers", "accelerate")


@dataclass(frozen=True)
class Sample:
    """One image to generate: prompt ``index`` of the prompt file, sample ``k`` with ``seed``."""

    index: int
    prompt: Prompt
    k: int
    seed: int

    @property
    def folder(self) -> str:
        return f"{self.index:05d}"

    @property
    def filename(self) -> str:
        """The results key, as ``negt2i evaluate OUT`` names it."""
        return f"{self.folder}/samples/{self.k:04d}.png"

    @property
    def provenance_name(self) -> str:
        return f"{self.folder}/provenance/{self.k:04d}.json"


def plan(
    prompts: Sequence[Prompt],
    seeds: Sequence[int] = DEFAULT_SEEDS,
    *,
    limit: int | None = None,
    shard: tuple[int, int] | None = None,
) -> list[Sample]:
    """The samples of a run: the first ``limit`` prompts, those of ``shard`` (I, N) = every N-th from I."""
    chosen = list(enumerate(prompts))[:limit] if limit is not None else list(enumerate(prompts))
    if shard is not None:
        index, count = shard
        if not 0 <= index < count:
            raise ValueError(f"shard {index}/{count}: need 0 <= I < N")
        chosen = [(i, p) for i, p in chosen if i % count == index]
    return [Sample(i, p, k, seed) for i, p in chosen for k, seed in enumerate(seeds)]


def library_versions() -> dict[str, str | None]:
    """Versions of Python and of the libraries that make the pixels (``None``: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """SHA-256 (16 hex digits) of the prompt records in order: which prompt each folder number means."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(dumps_prompt(p).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _sha256(path: Path) -> str:
    """SHA-256 of a regular file's bytes; a FIFO or device raises ``SpecialFileError`` (an ``OSError``) at once."""
    h = hashlib.sha256()
    with open_regular(path) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` under a hidden temporary name in the same folder, fsync, then rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def _json_bytes(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


class OutputFolder:
    """The output folder of one run (see the module docstring); holds a shard lock while open."""

    def __init__(self, root: Path, run: dict[str, Any], shard: tuple[int, int] | None) -> None:
        self.root = root
        self.run = run
        self.digest = str(run["settings_digest"])
        self.weights_digest: str | None = run.get("weights_digest")
        self._lock: IO[bytes] | None = None
        self._open(shard)

    def _open(self, shard: tuple[int, int] | None) -> None:
        root = self.root
        if root.exists() and not root.is_dir():
            raise GenerateError(f"{root} exists and is not a folder")
        root.mkdir(parents=True, exist_ok=True)
        run_file = root / RUN_FILE
        if not run_file.exists():
            foreign = sorted(p.name for p in root.iterdir() if not p.name.startswith(_OURS))
            if foreign:
                raise GenerateError(
                    f"{root} already holds files that negt2i generate did not write ({', '.join(foreign[:3])}"
                    f"{' ...' if len(foreign) > 3 else ''}); choose an empty or new folder"
                )
            tmp = root / f"{RUN_FILE}.tmp-{os.getpid()}"
            tmp.write_bytes(_json_bytes(self.run))
            try:
                os.link(tmp, run_file)  # atomic create: concurrent shards agree on one run file
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        try:
            existing = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise GenerateError(f"{run_file}: cannot be read ({exc}); not writing into {root}") from None
        self._check_same_run(existing)
        name = f"{_OURS}-{shard[0]}-of-{shard[1]}.lock" if shard else f"{_OURS}.lock"
        fh = (root / name).open("ab")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise GenerateError(f"{root} is being written by another negt2i generate run (same shard)") from None
        self._lock = fh

    def _check_same_run(self, existing: dict[str, Any]) -> None:
        diffs = []
        if existing.get("settings_digest") != self.digest:
            old, new = existing.get("settings") or {}, self.run["settings"]
            fields = sorted(k for k in set(old) | set(new) if k != "label" and old.get(k) != new.get(k))
            shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in fields[:6])
            diffs.append(f"settings ({shown or existing.get('settings_digest')})")
        if _differ(existing.get("weights_digest"), self.weights_digest):
            old_w, new_w = existing.get("weights") or {}, self.run["weights"]
            changed = sorted(k for k in set(old_w) & set(new_w) if old_w[k] != new_w[k]) or sorted(new_w)
            where = ", ".join(str(new_w[k].get("source", k)) for k in changed if k in new_w)
            diffs.append(
                f"weights (the files under {where} changed: weights digest {existing.get('weights_digest')} -> "
                f"{self.weights_digest})"
            )
        if existing.get("seeds") != self.run["seeds"]:
            diffs.append(f"seeds ({existing.get('seeds')} -> {self.run['seeds']})")
        if existing.get("prompts_digest") != self.run["prompts_digest"]:
            diffs.append("prompts (another prompt file or order)")
        if diffs:
            raise GenerateError(
                f"{self.root} was generated with other {'; '.join(diffs)}; one folder never mixes models, "
                f"weights or settings: start a new folder with another --out (e.g. --out {self._new_name()})"
            )

    def _new_name(self) -> str:
        """A suggestion for a new output folder: this one's name with the run's digest appended."""
        tail = self.weights_digest or self.digest
        return f"{self.root.as_posix().rstrip('/')}-{tail[:8]}"

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def state(self, sample: Sample) -> str:
        """``done``, ``missing`` or ``partial`` (a PNG without matching provenance: regenerated)."""
        png = self.root / sample.filename
        if not png.exists():
            return "missing"
        try:
            prov = json.loads(read_regular(self.root / sample.provenance_name))
        except (OSError, ValueError):  # unreadable, not a regular file, not JSON: made again
            return "partial"
        if not isinstance(prov, dict):
            return "partial"
        if prov.get("settings_digest") != self.digest:
            raise GenerateError(
                f"{self.root / sample.provenance_name} names settings {prov.get('settings_digest')}, this run "
                f"uses {self.digest}; one folder never mixes models or settings"
            )
        if _differ(prov.get("weights_digest"), self.weights_digest):
            raise GenerateError(
                f"{self.root / sample.provenance_name} was made from other weights (weights digest "
                f"{prov.get('weights_digest')}, now {self.weights_digest}); one folder never mixes images of "
                f"different weights: start a new folder with another --out (e.g. --out {self._new_name()})"
            )
        if prov.get("seed") != sample.seed or prov.get("prompt_id") != sample.prompt.id:
            return "partial"
        try:
            digest = _sha256(png)
        except OSError:  # unreadable, or not a regular file (a FIFO is never opened): made again
            return "partial"
        return "done" if prov.get("image_sha256") == digest else "partial"

    def ensure_metadata(self, sample: Sample) -> None:
        """Write ``<folder>/metadata.jsonl`` once; an existing one must hold this prompt."""
        path = self.root / sample.folder / "metadata.jsonl"
        line = dumps_prompt(sample.prompt)
        if path.exists():
            if path.read_text(encoding="utf-8").strip() != line:
                raise GenerateError(f"{path} holds another prompt than {sample.prompt.id!r}; not mixing prompts")
            return
        _write_atomic(path, (line + "\n").encode())

    def write(self, sample: Sample, png: bytes, provenance: dict[str, Any]) -> Path:
        """The PNG, then its provenance (both atomically); returns the PNG's path."""
        path = self.root / sample.filename
        _write_atomic(path, png)
        _write_atomic(self.root / sample.provenance_name, _json_bytes(provenance))
        return path


class Scoring(Protocol):
    """What the runner needs from a scorer (``negt2i.generate.scoring.Scorer``)."""

    done: set[str]

    def start(self) -> None: ...

    def submit(self, job: Job, data: bytes) -> None: ...

    def pending(self) -> int:
        """Images submitted and not finally answered yet."""
        ...

    def status(self) -> str:
        """A short note for the progress bar (e.g. ``scored 12, in flight 3``)."""
        ...

    def stop(self, reason: str = ...) -> None:
        """Stop scoring at once (an interrupt): what is in flight is left for the rerun."""
        ...


@dataclass
class GenerateSummary:
    """What a run did."""

    planned: int = 0
    skipped: int = 0
    generated: int = 0
    regenerated: int = 0
    """Of ``generated``: samples that existed partially (no valid provenance) and were made again."""
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        rate = f" ({self.generated / self.seconds:.2f} images/s)" if self.generated and self.seconds > 0 else ""
        again = f", {self.regenerated} of them partial before" if self.regenerated else ""
        from negt2i.metrics.totals import plural

        made = plural(self.generated, "image")
        return f"{made} generated{rate}{again}; {self.skipped} already done; {self.planned} in this run"


def encode_png(image: PILImage.Image) -> bytes:
    """PNG bytes of an RGB image."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return buf.getvalue()


def _batches(items: Sequence[Sample], size: int) -> Iterator[Sequence[Sample]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _job(root: Path, sample: Sample) -> Job:
    from negt2i.run.jobs import Job

    return Job(sample.filename, root / sample.filename, sample.k, sample.prompt, None, sample.prompt.id)


def _differ(recorded: Any, current: str | None) -> bool:
    """Two weights digests that are both known and differ (a folder from before digests, or a run whose
    generator was handed in without a local folder, has none to compare)."""
    return recorded is not None and current is not None and recorded != current


def weights_digest(weights: dict[str, Any]) -> str | None:
    """SHA-256 (16 hex digits) of a run's weights identity (``None`` when it does not name the model)."""
    if "model" not in weights:
        return None
    return hashlib.sha256(json.dumps(weights, sort_keys=True).encode()).hexdigest()[:16]


def effective_settings(spec: ModelSpec, info: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
    """The settings a sample was made with, as used: a value the spec leaves to the pipeline is the pipeline's
    default (``info["defaults"]``), the revision is the resolved commit, or for a local folder its content
    digest (``sha256:...``); only what the generator cannot tell stays ``None``."""
    defaults = info.get("defaults") or {}
    model = weights.get("model") or {}
    local = f"sha256:{model['sha256']}" if "sha256" in model else None
    return {
        "revision": info.get("revision") or model.get("revision") or local or spec.revision,
        "pipeline": info.get("pipeline") or spec.pipeline,
        "scheduler": info.get("scheduler"),
        "steps": spec.steps if spec.steps is not None else defaults.get("steps"),
        "guidance": spec.guidance if spec.guidance is not None else defaults.get("guidance"),
    }


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``."""
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def generate(
    spec: ModelSpec,
    prompts: Sequence[Prompt],
    out: str | Path,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    limit: int | None = None,
    shard: tuple[int, int] | None = None,
    batch_size: int = 4,
    device: str = "auto",
    allow_download: bool = False,
    generator: Generator | None = None,
    scorer: Scoring | None = None,
    progress: bool = True,
) -> GenerateSummary:
    """Generate the samples of ``prompts`` x ``seeds`` (see ``plan``) into ``out``, resuming; every new image
    (and every done one the scorer has no line for) goes to ``scorer`` as soon as it is on disk. The scorer is
    started here, once the output folder is open (``Scoring.start``); the caller closes it. The progress bar
    stays up until the scorer has answered every image (it ends at ``in flight 0``). On an interrupt (Ctrl-C)
    the scorer is stopped (``Scoring.stop``) before the ``KeyboardInterrupt`` goes on: what is in flight is
    left for the rerun, as ``negt2i submit`` and ``negt2i evaluate`` leave it, and the caller's close is prompt.

    ``spec.dtype`` must be the dtype actually used (the CLI resolves ``auto``). The model loads once, and only
    if something is left to generate."""
    import time

    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    root = Path(out)
    device = resolve_device(device)
    samples = plan(prompts, seeds, limit=limit, shard=shard)
    # Before anything is created: the weights are there (or one error says how to fetch them), and what they
    # are (a local folder's content digest, a cached repository's commit) joins the run's identity.
    weights = preflight(spec, allow_download=allow_download, strict=generator is None)
    run = {
        "tool": "negt2i generate",
        "settings": spec.record(),
        "settings_digest": spec.digest(),
        "weights": weights,
        "weights_digest": weights_digest(weights),
        "seeds": list(seeds),
        "prompts_digest": prompts_digest(prompts),
        "prompts": len(prompts),
    }
    folder = OutputFolder(root, run, shard)
    summary = GenerateSummary(planned=len(samples))
    try:
        if scorer is not None:
            scorer.start()  # after the folder is ours: its results file may live inside it
        todo: list[Sample] = []
        for sample in samples:
            folder.ensure_metadata(sample)
            state = folder.state(sample)
            if state == "done":
                summary.skipped += 1
                if scorer is not None:  # the scorer skips it when its line matches the file's content
                    scorer.submit(_job(root, sample), read_regular(root / sample.filename))
                continue
            summary.regenerated += state == "partial"
            todo.append(sample)
        if not todo:
            return summary
        gen = generator or create(spec, device=device, dtype=spec.dtype, allow_download=allow_download)
        info = gen.info()
        summary.info = info
        versions = library_versions()
        effective = effective_settings(spec, info, weights)
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="img", desc="generate", disable=not progress, dynamic_ncols=True)
        start = time.monotonic()
        for batch in _batches(todo, batch_size):
            padded = [*batch, *([batch[-1]] * (batch_size - len(batch)))]
            images = gen.generate([s.prompt.prompt for s in padded], [s.seed for s in padded])[: len(batch)]
            for sample, image in zip(batch, images, strict=True):
                png = encode_png(image)
                record = {
                    "filename": sample.filename,
                    "prompt_id": sample.prompt.id,
                    "prompt": sample.prompt.prompt,
                    "sample": sample.k,
                    "seed": sample.seed,
                    "model": spec.label,
                    "model_id": spec.model,
                    **effective,
                    "guidance_arg": spec.guidance_arg,
                    "guidance_in_effect": {**spec.guidance_record(), "scale": effective["guidance"]},
                    "resolution": [spec.width, spec.height],
                    "image_size": list(image.size),
                    "dtype": spec.dtype,
                    "quantize": list(spec.quantize),
                    "components": info.get("components") or {},
                    "settings": spec.record(),
                    "settings_digest": spec.digest(),
                    "weights": weights,
                    "weights_digest": folder.weights_digest,
                    "device": device,
                    "batch_size": batch_size,
                    "versions": versions,
                    "image_sha256": hashlib.sha256(png).hexdigest(),
                    "created": datetime.now(UTC).isoformat(timespec="seconds"),
                }
                folder.write(sample, png, record)
                summary.generated += 1
                if scorer is not None:
                    scorer.submit(_job(root, sample), png)
            bar.update(len(batch))
            if scorer is not None:
                bar.set_postfix_str(scorer.status(), refresh=False)
        summary.seconds = time.monotonic() - start
        if scorer is not None:  # the bar ends when the last image has its answer, not when it is drawn
            while scorer.pending():
                bar.set_postfix_str(scorer.status())
                time.sleep(0.2)
            bar.set_postfix_str(scorer.status(), refresh=False)
        bar.close()
        return summary
    except KeyboardInterrupt:  # stop scoring now, as submit and evaluate stop (negt2i.run.stream, "Stopping")
        if scorer is not None:
            scorer.stop()
        raise
    finally:
        folder.close()
