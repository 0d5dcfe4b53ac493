"""Write the JSON Schemas of ``negt2i.wire.schemas`` into ``protos/negt2i/v1/schemas/`` (reproducibly).

``python scripts/protos/schemas.py`` (also run by ``scripts/gen_protos.sh``); ``tests/protos`` fails when
the committed files differ from what this writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "protos" / "negt2i" / "v1" / "schemas"


def render(schema: dict[str, object]) -> str:
    """The file text of one schema: 2-space indented, keys in model order, a final newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def generate(out_dir: Path) -> list[Path]:
    """Write every schema into ``out_dir``; returns the written files, sorted."""
    sys.path.insert(0, str(REPO))
    from negt2i.wire.schemas import schemas

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in schemas().items():
        path = out_dir / name
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return sorted(written)


def main(argv: list[str] | None = None) -> int:
    """Regenerate the committed schemas (or ``--out DIR``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=SCHEMA_DIR, help="output directory (default: %(default)s)")
    args = parser.parse_args(argv)
    for stale in args.out.glob("*.schema.json"):
        stale.unlink()
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
