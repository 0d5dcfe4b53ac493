"""The orchestrator's memory limit holds what docs/services.md says it may hold, in every overlay.

The documented bounds ("Memory before a message is read") are the process and the messages being received
(``orchestrator.guard.reception_reserve``) plus twice the in-flight budget (admitted and waiting items); the
default budget is derived from the pod's memory limit (``orchestrator.admission.default_budget``). Each
rendered orchestrator Deployment is read as the pod would see it (its ConfigMap and env), and the settings
are parsed by the orchestrator's own reader.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import guard
from orchestrator.admission import BYTES_PER_PIXEL, MIB, default_budget
from orchestrator.settings import Settings
from tests.k8s.helpers import OVERLAYS, rendered

_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def _quantity(text: str) -> int:
    for suffix, factor in _UNITS.items():
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) * factor
    return int(text)


def _orchestrators() -> list[tuple[str, int, dict[str, str]]]:
    """(overlay, memory limit, the container's environment) of every rendered orchestrator Deployment."""
    found = []
    for overlay in OVERLAYS:
        objs = rendered(f"overlays/{overlay}")
        maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
        for obj in objs:
            if obj["kind"] != "Deployment" or obj["metadata"]["name"] != "orchestrator":
                continue
            (container,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "orchestrator"]
            env: dict[str, str] = {}
            for source in container.get("envFrom", []):
                env.update(maps[source["configMapRef"]["name"]])
            env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
            found.append((overlay, _quantity(container["resources"]["limits"]["memory"]), env))
    return found


ORCHESTRATORS = _orchestrators()


def test_every_overlay_has_an_orchestrator() -> None:
    assert {o for o, _, _ in ORCHESTRATORS} == set(OVERLAYS)


@pytest.mark.parametrize(("overlay", "limit", "env"), ORCHESTRATORS, ids=[o for o, _, _ in ORCHESTRATORS])
def test_documented_bounds_fit_the_memory_limit(overlay: str, limit: int, env: dict[str, Any]) -> None:
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("NEGT2I_")})
    reserve = guard.reception_reserve(settings)
    budget = settings.max_inflight_bytes or default_budget(limit=limit, reserve=reserve)
    assert reserve + 2 * budget <= limit, (
        f"{overlay}: {reserve >> 20} MiB reserved + 2 x {budget >> 20} MiB budget > the {limit >> 20} MiB limit"
    )
    largest = 4096 * 4096 * BYTES_PER_PIXEL + settings.max_message_bytes  # a 4096 px image at its largest
    assert budget >= largest, f"{overlay}: a {budget >> 20} MiB budget cannot admit one 4096 px image"


def test_default_budget_leaves_the_reserve_out() -> None:
    defaults = Settings()
    d = defaults
    assert (d.max_message_bytes, d.max_receiving, d.max_stream_receiving, d.max_calls, d.call_buffer_bytes) == (
        32 * MIB,
        2,
        4,
        256,
        64 << 10,
    )
    reserve = guard.reception_reserve(defaults)
    assert reserve == (256 + 6 * 64 + 16 + 9 * 64 + 16 + 16 + 5 * 64) * MIB  # B + health + unary + streams, T = 64 MiB
    assert default_budget(limit=3 << 30, reserve=reserve) == (3072 * MIB - reserve) // 2
    assert default_budget(limit=reserve, reserve=reserve) == 64 * MIB  # never below MIN_BUDGET
