"""Which backend a stage service builds: ``NEGT2I_<STAGE>_BACKEND``, else ``NEGT2I_BACKEND`` (the variable the
README and docs/services.md name, also read by the stage images), else the paper's model."""

from __future__ import annotations

from negt2i.stages.registry import DEFAULT_BACKENDS, STAGES
from negt2i.wire.stage_handlers import StageSettings


def test_the_per_stage_variable_wins_then_negt2i_backend_then_the_default():
    assert {s: StageSettings.from_env(s, {}).backend for s in STAGES} == {s: DEFAULT_BACKENDS[s] for s in STAGES}
    env = {"NEGT2I_BACKEND": "synthetic"}
    assert {StageSettings.from_env(s, env).backend for s in STAGES} == {"synthetic"}
    env["NEGT2I_DEPTH_BACKEND"] = "random"
    assert StageSettings.from_env("depth", env).backend == "random"
    assert StageSettings.from_env("detector", env).backend == "synthetic"
    assert StageSettings.from_env("detector", {"NEGT2I_BACKEND": ""}).backend == DEFAULT_BACKENDS["detector"]
