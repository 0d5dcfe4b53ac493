"""The shared configuration: the rule constants in the ConfigMap are the `current` preset,
and editing a generated ConfigMap rolls exactly the Deployments that use it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from negt2i.core.config import CURRENT, load_config
from tests.k8s.helpers import K8S, STAGES, by_kind, kustomize, rendered

RULES = K8S / "base" / "config" / "rules.json"


def test_the_rules_file_is_the_current_preset() -> None:
    config = load_config(str(RULES))
    assert config == CURRENT
    assert config.digest() == CURRENT.digest()


@pytest.mark.parametrize("overlay", ["overlays/gpu", "overlays/cpu-dev"])
def test_the_orchestrator_reads_the_mounted_rules_file(overlay: str) -> None:
    objs = rendered(overlay)
    configmaps = by_kind(objs, "ConfigMap")
    (env,) = [c for n, c in configmaps.items() if n.startswith("negt2i-config-")]
    (rules,) = [c for n, c in configmaps.items() if n.startswith("negt2i-rules-")]
    assert rules["data"]["rules.json"] == RULES.read_text()
    orchestrator = by_kind(objs, "Deployment")["orchestrator"]["spec"]["template"]["spec"]
    (volume,) = [v for v in orchestrator["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == rules["metadata"]["name"]
    (mount,) = [m for m in orchestrator["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert env["data"]["NEGT2I_RULES"] == f"{mount['mountPath']}/rules.json"
    assert env["data"]["NEGT2I_WEIGHTS_DIR"] == "/weights"


def _templates(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return {name: d["spec"]["template"] for name, d in by_kind(tuple(objs), "Deployment").items()}


@pytest.fixture(scope="module")
def k8s_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, copy)
    return copy


def _edit(path: Path, old: str, new: str) -> str:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return text


def test_changing_a_stage_url_or_setting_rolls_every_deployment(k8s_copy: Path) -> None:
    before = _templates(kustomize(k8s_copy / "overlays" / "gpu"))
    kustomization = k8s_copy / "base" / "kustomization.yaml"
    original = _edit(kustomization, "NEGT2I_DEPTH_URL=http://depth:3000", "NEGT2I_DEPTH_URL=http://depth-v2:3000")
    try:
        after = _templates(kustomize(k8s_copy / "overlays" / "gpu"))
    finally:
        kustomization.write_text(original)
    assert before.keys() == after.keys()
    for name in before:
        assert before[name] != after[name], f"{name} would keep running with the old configuration"


def test_changing_a_rule_constant_rolls_the_orchestrator_and_the_stages(k8s_copy: Path) -> None:
    before = _templates(kustomize(k8s_copy / "overlays" / "gpu"))
    rules = k8s_copy / "base" / "config" / "rules.json"
    original = _edit(rules, '"size_ratio": 1.05', '"size_ratio": 1.15')
    try:
        after = _templates(kustomize(k8s_copy / "overlays" / "gpu"))
    finally:
        rules.write_text(original)
    assert before["orchestrator"] != after["orchestrator"]
    for stage in STAGES:  # the stages apply some rule constants themselves (docs/stage-contract.md)
        assert before[stage] != after[stage], f"{stage} would keep applying the old rules"


def test_the_stage_definition_is_written_once_for_the_four_stages(k8s_copy: Path) -> None:
    # One edit of k8s/base/stage/stage.yaml reaches every stage Deployment and nothing else.
    before = _templates(kustomize(k8s_copy / "overlays" / "gpu"))
    definition = k8s_copy / "base" / "stage" / "stage.yaml"
    original = _edit(definition, "terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: 90")
    try:
        after = _templates(kustomize(k8s_copy / "overlays" / "gpu"))
    finally:
        definition.write_text(original)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == set(STAGES)
    for stage in STAGES:
        assert after[stage]["spec"]["terminationGracePeriodSeconds"] == 90
    # Each stage's own source holds only its name and backend: no second copy of the definition.
    for stage in STAGES:
        own = (K8S / "base" / "stages" / stage / "kustomization.yaml").read_text()
        assert "kind: Deployment\nmetadata" not in own and "containerPort" not in own and "resources:\n  -" in own
