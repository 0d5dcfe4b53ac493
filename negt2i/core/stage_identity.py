"""The one check of what a stage states about itself (its ``ModelInfo``), for both paths.

A served stage's ``GET /info`` (``orchestrator.stages.RemoteStages``) and an in-process backend's ``info``
(``negt2i.pipeline.Stages``) go through ``check_model_info``: the same rules, the same messages
(``docs/stage-contract.md``, "Rules the stages apply", "Operating point" and "Compatibility within v1").

What is checked, for a stage of kind ``stage`` under the run's rule config:

- ``model.stage`` names ``stage`` and ``model.model`` is set;
- ``model.rules``: every constant the stage states must be one the stage applies
  (``negt2i.core.config.STAGE_RULES``, ``OPTIONAL_STAGE_RULES``) and equal the config's value; a stated value
  that differs is always refused. An optional constant (added later: the attributes stage's text template
  set) left unstated means its default, so a config off that default refuses a stage that does not state it;
- a detector's ``model.operating_point``: its ``prediction_floor`` must be the config's
  ``detection.prediction_floor``.

What a stage *leaves unstated* (no ``rules``, some of them, or no ``operating_point``: the contract as it
stood before those fields, which conformance accepted) depends on ``strict``:

- ``strict`` off (the default): accepted, with a warning per assumption (``StageCheck.warnings``): the
  stage is assumed to apply the config's values (and a detector to have no suppression of its own at the
  config's floor). The warnings travel with the model's record: ``/info`` validation logs,
  ``GetServiceInfo``, the orchestrator's health details and every results line (``models.<stage>.warnings``);
- ``strict`` on (``NEGT2I_STRICT_STAGES=1``, ``--strict-stages``): refused, naming what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from negt2i.core.config import OPTIONAL_STAGE_RULES, STAGE_RULES, RuleConfig, stage_rules, stated_stage_rules
from negt2i.core.stage_types import ModelInfo

STRICT_ENV: Final = "NEGT2I_STRICT_STAGES"
"""Environment variable that turns strict stage checking on (``1``, ``true``, ``yes``, ``on``)."""


def strict_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``NEGT2I_STRICT_STAGES`` asks for strict stage checking (default off)."""
    value = (os.environ if env is None else env).get(STRICT_ENV, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class StageCheck:
    """The outcome of ``check_model_info``: refused (``problem``) or accepted, perhaps with ``warnings``."""

    problem: str = ""
    """Why the stage is refused; empty when it is accepted."""
    warnings: tuple[str, ...] = ()
    """What is assumed about an accepted stage that does not state it (empty: it states everything)."""

    @property
    def ok(self) -> bool:
        return not self.problem


def _fmt(values: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(values.items())) + "}"


def check_model_info(stage: str, info: ModelInfo, config: RuleConfig, *, strict: bool = False) -> StageCheck:
    """Whether a stage stating ``info`` may serve a run under ``config`` (see the module docstring)."""
    if info.stage != stage:
        return StageCheck(f"its model info names stage {info.stage!r}, but it serves the {stage}")
    if not info.model:
        return StageCheck("its model info names no model (ModelInfo.model)")
    want = stage_rules(config, stage)
    applies = (*STAGE_RULES[stage], *OPTIONAL_STAGE_RULES[stage])
    extra = sorted(set(info.rules) - set(applies))
    if extra:
        return StageCheck(f"it states rule constants {extra} that a {stage} does not apply (a {stage} applies "
                          f"{list(applies) or 'none'})")  # fmt: skip
    # an optional constant (added later, OPTIONAL_STAGE_RULES) is stated only off its default: unstated = default
    got = stated_stage_rules(stage, dict(info.rules))
    optional = set(OPTIONAL_STAGE_RULES[stage])
    differ = {k: v for k, v in got.items() if v != want.get(k)}
    differ |= {k: v for k, v in want.items() if k in optional and k not in got}
    if differ:
        return StageCheck(f"it applies rule constants {_fmt(got)}, this run's rules ({config.name}) say {_fmt(want)}: "
                          "give the stage the same rules (NEGT2I_RULES)")  # fmt: skip
    warnings: list[str] = []
    missing = {k: v for k, v in want.items() if k not in got and k not in optional}
    if missing:
        what = "no rule constants" if not got else f"no value for {sorted(missing)}"
        if strict:
            return StageCheck(f"it states {what} (ModelInfo.rules) and strict stages are on: state "
                              f"{_fmt(missing)} (docs/stage-contract.md, \"Compatibility within v1\")")  # fmt: skip
        warnings.append(f"states {what} (ModelInfo.rules; a stage of the contract before them): assumed to apply "
                        f"this run's {_fmt(missing)} (rules {config.name})")  # fmt: skip
    if stage == "detector":
        floor = config.detection.prediction_floor
        op = info.operating_point
        if op is None:
            if strict:
                return StageCheck("it states no operating point (ModelInfo.operating_point) and strict stages are "
                                  "on: state its prediction_floor, suppression and input_size")  # fmt: skip
            warnings.append("states no operating point (ModelInfo.operating_point): assumed prediction floor "
                            f"{floor:g}, no suppression of its own, as the paper's thresholds assume")  # fmt: skip
        elif op.prediction_floor != floor:
            return StageCheck(f"its operating point's prediction_floor {op.prediction_floor:g} is not this run's "
                              f"detection.prediction_floor {floor:g} (rules {config.name})")  # fmt: skip
    return StageCheck("", tuple(warnings))
