"""A backend asked for a device it cannot use says so: one warning line per backend and device."""

from __future__ import annotations

import pytest

from negt2i.stages import registry


def test_synthetic_backends_asked_for_cuda_say_they_run_on_the_cpu(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(registry, "_warned", set())
    registry.create("detector", "synthetic", device="cuda")
    registry.create("depth", "synthetic", device="cuda")  # the same backend: said once
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert "backend 'synthetic'" in err and "runs on cpu only" in err and "'cuda' is not used" in err
    for device in ("auto", "cpu"):
        registry.create("detector", "synthetic", device=device)
    registry.create("segmenter", "synthetic", device="cuda:1")  # another device: said again
    assert capsys.readouterr().err.count("warning:") == 1


def test_a_backend_on_the_requested_device_is_quiet(capsys: pytest.CaptureFixture[str]):
    registry.check_device("detector", "x", "cuda:1", "cuda:0")
    registry.check_device("detector", "x", "cpu", "cpu")
    assert capsys.readouterr().err == ""
