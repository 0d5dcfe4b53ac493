"""docs/api.md's Python examples, run as written against a real orchestrator (target and image swapped in)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from tests.services.live import REPO, Proc

pytestmark = pytest.mark.xdist_group("services")


def _python_blocks(heading: str = "## Examples") -> list[str]:
    """The Python code blocks of one section of docs/api.md (``heading`` up to the next ``## ``)."""
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    return re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def _run(code: str, target: str, image: Path) -> str:
    code = code.replace("127.0.0.1:50051", target).replace('"dog.png"', repr(str(image)))
    # the stubs a client generates with -I protos are the package negt2i.v1; ours live at negt2i.wire.v1
    code = code.replace("from negt2i.v1 import", "from negt2i.wire.v1 import")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/api.md", "exec"), {"__name__": "docs_example"})
    return out.getvalue()


@pytest.fixture(scope="module")
def dog_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    image = render_scene([SceneObject("horse", (2, 10, 28, 40)), SceneObject("dog", (36, 44, 60, 60), "ellipse")],
                         (64, 64))  # fmt: skip
    path = tmp_path_factory.mktemp("doc") / "dog.png"
    path.write_bytes(adapter.encode_png(image))
    return path


def test_the_python_examples_of_the_guide_run(orchestrator: Proc, dog_png: Path):
    blocks = _python_blocks()
    assert len(blocks) == 3
    with_client = _run(blocks[0], orchestrator.target, dog_png).splitlines()
    assert with_client[0] == "['person', 'bicycle', 'car']"
    correct, _, reason = with_client[1].partition(" ")
    assert correct in {"True", "False"} and (reason == "") == (correct == "True")
    raw = _run(blocks[1], orchestrator.target, dog_png).split()
    assert raw == [correct, "depth"]  # the same image and prompt: the same verdict; tag unset: the category
    streamed = [line.split() for line in _run(blocks[2], orchestrator.target, dog_png).splitlines()]
    assert [words[0] for words in streamed] == ["0", "1", "2"]  # one answer per image, in order
    assert len({words[1] for words in streamed}) == 1 and streamed[0][1] in {"True", "False"}  # the same verdict
