"""``negt2i audit``: see why each verdict came out as it did, without running a model again.

For a chosen or sampled set of judged images, ``write_audit`` writes one
self-contained HTML page (CSS inline, images as base64 PNG, no scripts) and the
PNGs it shows: each image with the prompt's objects' masks (the refined masks the
relation rules measured, else the detector's) and boxes overlaid and labelled,
then every object's presence and count and every statement's verdict, failure
cause and evidence *in words*, read from the results line's ``measurements``
(schema in ``docs/results.md``) and the perception side file written by
``--save-perception``. Dead-zone cases (a positive statement failing, or a negated
one passing, because no predicate fired) are marked.

Selection (``select``): ``filenames`` (exact results keys) or every judged line,
then ``failed`` (incorrect only) and ``categories``, then at most ``limit``
lines drawn with ``numpy.random.default_rng(seed)`` and shown in file order.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from negt2i.core.perception_file import SavedPerception, decode

PALETTE: tuple[tuple[int, int, int], ...] = (
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (23, 190, 207),
)
"""Overlay colour of object 0, 1, 2, ... (repeats after six)."""

MIN_SIDE = 448
"""Images are shown at least this large (nearest-neighbour upscaling keeps mask edges honest)."""

MAX_SIDE = 1024
"""... and at most this large (larger images are downscaled for the page)."""


class AuditError(ValueError):
    """The audit cannot run (no results, a selected filename not in the results, ...)."""


# --------------------------------------------------------------------------- selection


def select(
    lines: Sequence[Mapping[str, Any]],
    *,
    filenames: Sequence[str] = (),
    failed: bool = False,
    categories: Sequence[str] = (),
    limit: int | None = None,
    seed: int = 0,
) -> list[Mapping[str, Any]]:
    """The lines to audit (see the module docstring); error lines are never selected."""
    judged = [r for r in lines if r.get("status") == "ok"]
    if filenames:
        by_name = {str(r.get("filename")): r for r in judged}
        unknown = [f for f in filenames if f not in by_name]
        if unknown:
            raise AuditError(f"not a judged image of these results: {', '.join(unknown)}")
        chosen = [by_name[f] for f in dict.fromkeys(filenames)]
    else:
        chosen = judged
    if failed:
        chosen = [r for r in chosen if not r.get("correct")]
    if categories:
        chosen = [r for r in chosen if r.get("category") in set(categories)]
    if limit is not None and len(chosen) > limit:
        keep = set(np.random.default_rng(seed).choice(len(chosen), size=limit, replace=False).tolist())
        chosen = [r for k, r in enumerate(chosen) if k in keep]
    return chosen


# --------------------------------------------------------------------------- evidence in words


def _f(v: Any, digits: int = 2) -> str:
    return f"{float(v):.{digits}f}"


def _score(v: float | None) -> str:
    return "none" if v is None else _f(v, 3)


def _name(objects: Sequence[Mapping[str, Any]], i: int) -> str:
    return f"the {objects[i]['class']}"


def explain_object(o: Mapping[str, Any]) -> str:
    """Presence and count of one object, in words, from its measurements."""
    m = o.get("measurements") or {}
    kept = m.get("kept", [])
    cls = o["class"]
    pres, cnt = m.get("presence_threshold"), m.get("count_threshold")
    if not o["present"]:
        if not kept:
            return f"{cls}: not detected (no detection of the class above the floor {m.get('prediction_floor')})."
        return f"{cls}: not present: top score {_f(kept[0][1], 3)} < presence threshold {pres}."
    scores = ", ".join(f"#{i} {_f(s, 3)}" for i, s in kept[:6]) + (" ..." if len(kept) > 6 else "")
    text = f"{cls}: present (top score {_f(o['top_score'], 3)} >= {pres}); kept detections {scores}; "
    if o["fallback"]:
        text += f"none reaches the counting threshold {cnt}, so the most confident one counts alone"
    else:
        text += f"{o['counted']} reach the counting threshold {cnt}"
    text += f"; requested {o['requested']}."
    if o["over_count"]:
        text += f" Over-counted ({o['counted']} > {o['requested']})."
    elif o["under_count"]:
        text += f" Under-counted ({o['counted']} < {o['requested']})."
    elif o["exempt"] and o["counted"] > o["requested"]:
        text += " More counted than requested, but this class is exempt from over-count."
    return text


def _side(value: float, neg: str, pos: str) -> str:
    return neg if value < 0 else pos


def explain_statement(s: Mapping[str, Any], objects: Sequence[Mapping[str, Any]]) -> str:
    """The evidence of one statement's decision, in words, from its measurements."""
    m = s.get("measurements") or {}
    rule = m.get("rule")
    idx = list(s["objects"])
    a = _name(objects, idx[0])
    b = _name(objects, idx[1]) if len(idx) > 1 else ""
    req = s["requested"]
    if rule == "unevaluated":
        parts = []
        for o in m.get("objects", []):
            if not o["present"]:
                parts.append(f"the {o['class']} is not present (top score {_score(o['top_score'])})")
            elif o["under_count"]:
                parts.append(f"the {o['class']} is under-counted ({o['counted']} < {o['requested']})")
            elif o["over_count"]:
                parts.append(f"the {o['class']} is over-counted ({o['counted']} > {o['requested']})")
        return "Not evaluated: " + ("; ".join(parts) or m.get("unevaluated", "")) + "."
    if m.get("degenerate"):
        return f"Nothing can fire: an empty mask (areas {m.get('area_a')} and {m.get('area_b')} px)."
    if rule == "attribute":
        top_vals = ", ".join(m["top_values"])
        text = (
            f"SigLIP 2 scores the {objects[idx[0]]['class']} (detection #{m['detection']}): '{req}' "
            f"{_f(m['value_score'])}, top {top_vals} {_f(m['top_score'])} (margin {_f(m['margin'])}). "
        )
        if m["beta"] > 0:
            text += f"A value is present when within beta = {m['beta']} of the top; "
        else:
            text += f"Only the top value is present (beta = {m['beta']}); "
        return text + f"'{req}' is {'present' if req in (s['fired'] or []) else 'absent'}."
    if rule == "directional":
        alpha = m["axis_threshold"]
        dx, dy = m["dx"], m["dy"]
        horiz = (
            f"{a}'s centroid is {_f(abs(m['offset_x']), 1)} px {_side(m['offset_x'], 'left of', 'right of')} "
            f"{b}'s; less the extent margin ({m['extent_margin']} x {m['extent_sum_x']} px) that is "
            f"{_f(abs(dx))} of their centre distance ({_f(m['center_distance'], 1)} px)"
        )
        vert = (
            f"it is {_f(abs(m['offset_y']), 1)} px {_side(m['offset_y'], 'above', 'below')}; less the margin "
            f"({m['extent_margin']} x {m['extent_sum_y']} px) that is {_f(abs(dy))}"
        )
        return f"Horizontally {horiz}; vertically {vert}. '{req}' needs more than {alpha} on its axis."
    if rule == "proximity":
        verdict = "near" if m["gap"] < m["threshold"] else "far from"
        return (
            f"The masks are {_f(m['gap'], 1)} px apart (closest pixels); 'near' needs less than gamma x R = "
            f"{m['gap_factor']} x {_f(m['radius'], 1)} = {_f(m['threshold'], 1)} px (R: mean equivalent radius), "
            f"so the pair is {verdict}."
        )
    if rule == "comparative":
        rho = m["size_ratio"]
        return (
            f"Area: {a} {m['area_a']} px vs {b} {m['area_b']} px (ratio {_f(m['area_ratio'], 3)}); "
            f"height: {m['height_a']} vs {m['height_b']} px (ratio {_f(m['height_ratio'], 3)}). "
            f"A size or height predicate needs a ratio above {rho} (or below 1/{rho} = {_f(1 / rho, 3)})."
        )
    if rule == "depth":
        return (
            f"Facing surfaces ({m['facing_pixels_a']} and {m['facing_pixels_b']} px within gap + {m['facing_window']} "
            f"px): mean disparity {a} {_f(m['disparity_a'], 3)}, {b} {_f(m['disparity_b'], 3)} (larger is closer); "
            f"the difference is {_f(m['normalized_difference'], 3)} of the image's disparity range; a depth "
            f"predicate needs at least beta0 + beta1 x gap / R = {m['base_margin']} + {m['separation_slope']} x "
            f"{_f(m['gap'], 1)} / {_f(m['radius'], 1)} = {_f(m['required_margin'], 3)}."
        )
    return "No measurements recorded."


def statement_outcome(s: Mapping[str, Any], category: str | None) -> str:
    """PASS / FAIL with what fired, the cause and the dead-zone mark, in words."""
    fired = s["fired"]
    fired_text = "not evaluated" if fired is None else ("nothing fired" if not fired else "fired: " + ", ".join(fired))
    out = f"{'PASS' if s['passed'] else 'FAIL'} ({fired_text})"
    if s.get("cause"):
        out += f"; cause: {str(s['cause']).replace('_', ' ')}"
    if is_dead_zone(s, category):
        out += "; dead zone: no predicate was decisive"
    return out


def is_dead_zone(s: Mapping[str, Any], category: str | None) -> bool:
    """A dead-zone case: a dead-zone pass (negated) or a dead-zone failure (positive)."""
    return bool(s.get("dead_zone")) or s.get("cause") == "dead_zone"


# --------------------------------------------------------------------------- drawing


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pragma: no cover - Pillow < 10.1
        return ImageFont.load_default()


def draw_overlay(image: NDArray[np.uint8], line: Mapping[str, Any], seen: SavedPerception | None) -> bytes:
    """PNG of the image with each object's masks and boxes (colour per object) and labels."""
    from PIL import Image, ImageDraw

    h, w = image.shape[:2]
    scale = 1.0
    if max(h, w) < MIN_SIDE:
        scale = float(math.ceil(MIN_SIDE / max(h, w)))
    elif max(h, w) > MAX_SIDE:
        scale = MAX_SIDE / max(h, w)
    base = image.astype(np.float32)
    layers: list[tuple[int, int, str, tuple[float, float, float, float], bool]] = []
    for o in line["objects"]:
        tint = np.array(PALETTE[o["index"] % len(PALETTE)], dtype=np.float32)
        counted = set(o.get("detections", []))
        for det, _score in (o.get("measurements") or {}).get("kept", []):
            if seen is None or det not in seen.detections:
                continue
            d = seen.detections[det]
            mask = seen.mask(det) if det in counted else None
            if mask is not None and mask.shape == (h, w):
                base[mask] = 0.45 * base[mask] + 0.55 * tint
            layers.append((o["index"], det, f"{o['index']}: {o['class']} #{det} {d.score:.2f}", d.box, det in counted))
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    if scale != 1.0:
        img = img.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(img)
    font = _font(13)
    for obj, _det, label, (x0, y0, x1, y1), is_counted in layers:
        color = PALETTE[obj % len(PALETTE)]
        box = [x0 * scale, y0 * scale, max(x0 * scale, x1 * scale - 1), max(y0 * scale, y1 * scale - 1)]
        if is_counted:
            draw.rectangle(box, outline=color, width=3)
        else:  # kept but not counted: a thin outline
            draw.rectangle(box, outline=color, width=1)
        tx, ty = box[0] + 2, max(0.0, box[1] - 16) if box[1] >= 16 else box[1] + 2
        tb = draw.textbbox((tx, ty), label, font=font)
        draw.rectangle([tb[0] - 2, tb[1] - 1, tb[2] + 2, tb[3] + 1], fill=color)
        draw.text((tx, ty), label, fill=(255, 255, 255), font=font)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def placeholder_png(text: str) -> bytes:
    """A small PNG card saying ``text`` (at most 70 characters): what an audit page shows for an image it
    could not read."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (MIN_SIDE, 120), (245, 245, 247))
    ImageDraw.Draw(img).text((12, 50), text[:70], fill=(120, 30, 30), font=_font(13))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- the page


CSS = (
    "body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1250px;"
    "color:#222;padding:0 1rem}h1{font-size:1.5rem}.card{border:1px solid #ddd;border-radius:6px;padding:1rem;"
    "margin:1.2rem 0;display:flex;gap:1.2rem;flex-wrap:wrap}.card img{max-width:520px;height:auto;"
    "border:1px solid #ccc}.info{flex:1;min-width:420px}.info h2{font-size:1.05rem;margin:.1rem 0 .4rem}"
    ".prompt{font-style:italic}.badge{display:inline-block;padding:.05rem .45rem;border-radius:4px;"
    "font-size:.8rem;font-weight:600;margin-right:.3rem}.pass{background:#dff0d8;color:#2b662b}"
    ".fail{background:#f8d7da;color:#8a1f2a}.dz{background:#efe3fb;color:#5b2c91}"
    "table{border-collapse:collapse;font-size:.85rem;width:100%}td,th{border-bottom:1px solid #eee;"
    "padding:.3rem .4rem;text-align:left;vertical-align:top}th{background:#f5f5f7}.note{color:#666;"
    "font-size:.8rem}ul.objs{font-size:.85rem;padding-left:1.1rem}.sw{display:inline-block;width:.8rem;"
    "height:.8rem;border-radius:2px;margin-right:.3rem;vertical-align:middle}"
)


def safe_name(filename: str) -> str:
    """``filename`` reduced to letters, digits, ``.``, ``_`` and ``-`` (other runs become ``_``): safe as a file
    name and an HTML id; ``image`` when nothing is left."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", filename).strip("_") or "image"


@dataclass(frozen=True)
class AuditPage:
    """What ``write_audit`` wrote."""

    html: Path
    images: list[Path]
    audited: int
    without_perception: int


def _card(line: Mapping[str, Any], png_b64: str, png_name: str, seen: SavedPerception | None) -> str:
    e = html.escape
    ok = bool(line.get("correct"))
    objects = line["objects"]
    badges = f"<span class='badge {'pass' if ok else 'fail'}'>{'CORRECT' if ok else 'INCORRECT'}</span>"
    if line.get("failure_class"):
        badges += f"<span class='badge fail'>{e(str(line['failure_class']).replace('_', ' '))}</span>"
    if any(is_dead_zone(s, line.get("category")) for s in line["statements"]):
        badges += "<span class='badge dz'>dead zone</span>"
    objs = "".join(
        f"<li><span class='sw' style='background:rgb{PALETTE[o['index'] % len(PALETTE)]}'></span>"
        f"{e(explain_object(o))}</li>"
        for o in objects
    )
    rows = []
    for s in line["statements"]:
        dz = is_dead_zone(s, line.get("category"))
        verdict = (
            f"<span class='badge {'pass' if s['passed'] else 'fail'}'>{'PASS' if s['passed'] else 'FAIL'}</span>"
            + ("<span class='badge dz'>dead zone</span>" if dz else "")
        )
        rows.append(
            f"<tr><td>{e(s['text'])}<br><span class='note'>{e(s['polarity'])}, {e(s['kind'])}</span></td>"
            f"<td>{verdict}<br><span class='note'>{e(statement_outcome(s, line.get('category')))}</span></td>"
            f"<td>{e(explain_statement(s, objects))}</td></tr>"
        )
    missing = (
        ""
        if seen is not None
        else "<p class='note'>No perception stored for this image: boxes and masks are not drawn.</p>"
    )
    return (
        f"<section class='card' id='{e(safe_name(str(line['filename'])))}'>"
        f"<div><img alt='{e(str(line['filename']))} with masks and boxes' src='data:image/png;base64,{png_b64}'>"
        f"<div class='note'>{e(png_name)}</div></div>"
        f"<div class='info'><h2>{e(str(line['filename']))}</h2>"
        f"<p class='prompt'>&ldquo;{e(str(line.get('prompt', '')))}&rdquo;</p>"
        f"<p>{badges}<span class='note'>{e(str(line.get('category')))} / {e(str(line.get('setting')))} &middot; "
        f"prompt {e(str(line.get('prompt_id')))} &middot; rules {e(str((line.get('config') or {}).get('name')))}"
        f"</span></p>{missing}<ul class='objs'>{objs}</ul>"
        f"<table><thead><tr><th>Statement</th><th>Verdict</th><th>Evidence</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def write_audit(
    lines: Iterable[Mapping[str, Any]],
    images_root: str | Path,
    out: str | Path,
    *,
    perception: Mapping[str, Mapping[str, Any]] | None = None,
    title: str = "NegT2IBench audit",
    selection_note: str = "",
    filename: str = "audit.html",
) -> AuditPage:
    """Write the page ``out/filename`` and ``out/images/*.png`` for ``lines`` (already selected)."""
    from negt2i.core.images import load_image

    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    root = Path(images_root)
    cards: list[str] = []
    pngs: list[Path] = []
    without = 0
    chosen = list(lines)
    for line in chosen:
        name = str(line["filename"])
        record = (perception or {}).get(name)
        seen = decode(record) if record is not None else None
        without += seen is None
        try:
            pixels = load_image(root / name)
            png = draw_overlay(pixels, line, seen)
        except (ValueError, OSError) as exc:
            png = placeholder_png(f"image not readable: {exc}")
        png_path = out / "images" / (safe_name(str(Path(name).with_suffix(""))) + ".png")
        png_path.write_bytes(png)
        pngs.append(png_path)
        cards.append(_card(line, base64.b64encode(png).decode("ascii"), f"images/{png_path.name}", seen))
    e = html.escape
    toc = "".join(
        f"<li><a href='#{e(safe_name(str(r['filename'])))}'>{e(str(r['filename']))}</a> "
        f"{'correct' if r.get('correct') else e(str(r.get('failure_class') or 'incorrect'))}</li>"
        for r in chosen
    )
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{e(title)}</title><style>{CSS}</style></head><body><h1>{e(title)}</h1>"
        f"<p class='note'>{e(selection_note)} {len(chosen)} images. Colours: one per prompt object; thick box and "
        "filled mask: counted instances (the masks the rules measured: refined for relations, detector masks for "
        "attributes); thin box: kept but not counted. Numbers: the results line's measurements "
        "(docs/results.md).</p>"
        + (
            f"<p class='note'>{without} images have no stored perception (run with --save-perception).</p>"
            if without
            else ""
        )
        + f"<details><summary>Images</summary><ol>{toc}</ol></details>"
        + "".join(cards)
        + "</body></html>"
    )
    html_path = out / filename
    html_path.write_text(page, encoding="utf-8")
    return AuditPage(html_path, pngs, len(chosen), without)
