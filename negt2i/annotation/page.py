"""The labelling page: one static HTML file, no network, no server (the layout of the paper's Figure 7).

The annotator enters an id once; each image shows the prompt in full, the image, and one yes / no question per
object and per statement, all asked affirmatively. Answers are saved in the browser's localStorage under
``negt2i-labels/<task_id>/<annotator>`` after every click, so closing the tab loses nothing. Keyboard:
``y`` / ``n`` answer the current question and move on, up / down arrows change the question, left / right
arrows (or ``[`` / ``]``) change the image, Enter jumps to the next unfinished image. The export buttons
download ``labels-<annotator>.jsonl`` / ``.csv`` with one row per (image, element, annotator, answer) of the
finished images: the file ``negt2i agreement --labels`` and ``negt2i labels import`` read.

The page never shows the expected answers, the polarity or the generator.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>NegT2IBench labelling task __TASK_ID__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font-family: system-ui, sans-serif; margin: 0; background: #f4f4f4; color: #222; }
header { display: flex; gap: 1em; align-items: center; padding: .6em 1em; background: #263238; color: #fff;
         flex-wrap: wrap; }
header input { font-size: 1em; width: 9em; }
header button, .nav button { font-size: .95em; padding: .3em .8em; }
main { max-width: 980px; margin: 1em auto; background: #fff; padding: 1em 1.5em; border-radius: 6px; }
#prompt { font-size: 1.25em; margin: .2em 0 .8em; }
#image { display: block; max-width: 100%; max-height: 60vh; margin: 0 auto 1em; border: 1px solid #ccc; }
ol#questions { padding-left: 1.5em; }
ol#questions li { display: flex; justify-content: space-between; align-items: center; padding: .35em .5em;
                  border-radius: 4px; margin: .15em 0; }
ol#questions li.current { outline: 2px solid #1e88e5; background: #e3f2fd; }
ol#questions li .text { flex: 1; }
ol#questions button { min-width: 4.5em; margin-left: .4em; padding: .3em; font-size: 1em; cursor: pointer;
                      border: 1px solid #999; border-radius: 4px; background: #fafafa; }
ol#questions button.chosen.yes { background: #43a047; color: #fff; }
ol#questions button.chosen.no { background: #e53935; color: #fff; }
.nav { display: flex; justify-content: space-between; margin-top: 1em; }
#status { color: #555; }
.help { font-size: .85em; color: #666; margin-top: 1em; }
#gate { padding: 2em; text-align: center; }
</style>
</head>
<body>
<header>
  <strong>NegT2IBench labelling</strong>
  <label>Annotator id <input id="annotator" autocomplete="off" placeholder="e.g. a07"></label>
  <button id="start">Start</button>
  <span id="progress">0 / 0 images done</span>
  <button id="export-jsonl">Export labels (JSONL)</button>
  <button id="export-csv">Export labels (CSV)</button>
</header>
<main>
  <div id="gate">Enter your annotator id and press Start.</div>
  <section id="item" hidden>
    <div id="counter"></div>
    <p id="prompt"></p>
    <img id="image" alt="generated image">
    <p>Answer each question about the image above.</p>
    <ol id="questions"></ol>
    <div class="nav">
      <button id="prev">&larr; Previous</button>
      <span id="status"></span>
      <button id="next">Next &rarr;</button>
    </div>
  </section>
  <p class="help">Keys: <b>y</b> / <b>n</b> answer the highlighted question, <b>&uarr;</b> / <b>&darr;</b> change
  question, <b>&larr;</b> / <b>&rarr;</b> change image, <b>Enter</b> next unfinished image. Answers are saved in
  this browser as you go; use Export when done and send the file back.</p>
</main>
<script type="application/json" id="task">__TASK_JSON__</script>
<script>
"use strict";
const TASK = JSON.parse(document.getElementById("task").textContent);
const state = { annotator: null, answers: {}, index: 0, current: 0 };
const $ = (id) => document.getElementById(id);
const ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$/;

function storageKey() { return "negt2i-labels/" + TASK.task_id + "/" + state.annotator; }
function save() { localStorage.setItem(storageKey(), JSON.stringify({ answers: state.answers, index: state.index })); }
function load() {
  const raw = localStorage.getItem(storageKey());
  const saved = raw ? JSON.parse(raw) : {};
  state.answers = saved.answers || {};
  state.index = Math.min(saved.index || 0, TASK.items.length - 1);
}
function done(item) {
  const a = state.answers[item.id] || {};
  return item.questions.every((q) => a[q.element] === "yes" || a[q.element] === "no");
}
function finished() { return TASK.items.filter(done); }

function start() {
  const who = $("annotator").value.trim();
  if (!ID_RE.test(who)) { alert("Annotator id: 1-64 letters, digits, _ . @ - (e.g. a07)"); return; }
  state.annotator = who;
  localStorage.setItem("negt2i-annotator", who);
  load();
  $("gate").hidden = true;
  $("item").hidden = false;
  show(state.index);
}

function show(index) {
  state.index = Math.max(0, Math.min(index, TASK.items.length - 1));
  const item = TASK.items[state.index];
  const a = state.answers[item.id] || {};
  const firstOpen = item.questions.findIndex((q) => !(q.element in a));
  state.current = firstOpen < 0 ? 0 : firstOpen;
  $("counter").textContent = "Image " + (state.index + 1) + " of " + TASK.items.length;
  $("prompt").textContent = "Prompt: " + item.prompt;
  $("image").src = item.file;
  const list = $("questions");
  list.innerHTML = "";
  item.questions.forEach((q, k) => {
    const li = document.createElement("li");
    li.dataset.element = q.element;
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = q.text;
    li.appendChild(text);
    for (const ans of ["yes", "no"]) {
      const b = document.createElement("button");
      b.className = ans + (a[q.element] === ans ? " chosen" : "");
      b.dataset.answer = ans;
      b.textContent = ans === "yes" ? "Yes" : "No";
      b.addEventListener("click", () => answer(k, ans));
      li.appendChild(b);
    }
    list.appendChild(li);
  });
  highlight();
  save();
  progress();
}

function highlight() {
  [...$("questions").children].forEach((li, k) => li.classList.toggle("current", k === state.current));
}

function answer(k, ans) {
  const item = TASK.items[state.index];
  const a = (state.answers[item.id] = state.answers[item.id] || {});
  a[item.questions[k].element] = ans;
  save();
  const li = $("questions").children[k];
  for (const b of li.querySelectorAll("button")) b.classList.toggle("chosen", b.dataset.answer === ans);
  state.current = Math.min(k + 1, item.questions.length - 1);
  highlight();
  progress();
}

function progress() {
  const n = finished().length;
  $("progress").textContent = n + " / " + TASK.items.length + " images done";
  $("status").textContent = done(TASK.items[state.index]) ? "this image is done" : "questions left on this image";
}

function nextOpen() {
  for (let s = 1; s <= TASK.items.length; s++) {
    const k = (state.index + s) % TASK.items.length;
    if (!done(TASK.items[k])) { show(k); return; }
  }
}

function rows() {
  const out = [];
  for (const item of finished()) {
    for (const q of item.questions) {
      out.push({ image: item.image, element: q.element, annotator: state.annotator,
                 answer: state.answers[item.id][q.element] });
    }
  }
  return out;
}

function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type: type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function csvCell(v) { return /[",\\n]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; }

function exportLabels(kind) {
  if (!state.annotator) { alert("Start with your annotator id first."); return; }
  const r = rows();
  const open = TASK.items.length - finished().length;
  if (open && !confirm(open + " images are not finished and are left out of the export. Export anyway?")) return;
  if (kind === "csv") {
    const lines = ["image,element,annotator,answer"].concat(
      r.map((x) => [x.image, x.element, x.annotator, x.answer].map(csvCell).join(",")));
    download("labels-" + state.annotator + ".csv", lines.join("\\n") + "\\n", "text/csv");
  } else {
    download("labels-" + state.annotator + ".jsonl", r.map((x) => JSON.stringify(x)).join("\\n") + "\\n",
             "application/x-ndjson");
  }
}

document.addEventListener("keydown", (e) => {
  if (!state.annotator || e.target.tagName === "INPUT") {
    if (e.key === "Enter" && e.target.id === "annotator") start();
    return;
  }
  const item = TASK.items[state.index];
  if (e.key === "y" || e.key === "n") answer(state.current, e.key === "y" ? "yes" : "no");
  else if (e.key === "ArrowDown") {
    state.current = Math.min(state.current + 1, item.questions.length - 1);
    highlight();
  }
  else if (e.key === "ArrowUp") { state.current = Math.max(state.current - 1, 0); highlight(); }
  else if (e.key === "ArrowRight" || e.key === "]") show(state.index + 1);
  else if (e.key === "ArrowLeft" || e.key === "[") show(state.index - 1);
  else if (e.key === "Enter") nextOpen();
  else return;
  e.preventDefault();
});
$("start").addEventListener("click", start);
$("prev").addEventListener("click", () => show(state.index - 1));
$("next").addEventListener("click", () => show(state.index + 1));
$("export-jsonl").addEventListener("click", () => exportLabels("jsonl"));
$("export-csv").addEventListener("click", () => exportLabels("csv"));
$("annotator").value = localStorage.getItem("negt2i-annotator") || "";
$("progress").textContent = "0 / " + TASK.items.length + " images done";
</script>
</body>
</html>
"""


def render_page(manifest: Mapping[str, Any]) -> str:
    """The page for a task manifest (``negt2i.annotation.task``): only what the annotator needs is embedded."""
    data = {
        "task_id": manifest["task_id"],
        "items": [
            {
                "id": i["id"],
                "file": i["file"],
                "image": i["image"],
                "prompt": i["prompt"],
                "questions": [{"element": q["element"], "text": q["text"]} for q in i["questions"]],
            }
            for i in manifest["items"]
        ],
    }
    text = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    return _PAGE.replace("__TASK_ID__", html.escape(str(manifest["task_id"]))).replace("__TASK_JSON__", text)
