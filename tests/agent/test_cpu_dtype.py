"""bfloat16 on a CPU without bf16 units is warned about (its matmuls run ~40x slower than float32 there)."""

from __future__ import annotations

import logging

import pytest

from agent.backends import models


@pytest.mark.parametrize(
    ("has_bf16", "bf16", "device", "warned"),
    [
        (False, True, "cpu", True),
        (True, True, "cpu", False),
        (False, False, "cpu", False),
        (False, True, "cuda", False),
    ],
)
def test_bf16_is_warned_only_on_a_cpu_without_bf16_units(monkeypatch, caplog, has_bf16, bf16, device, warned) -> None:
    monkeypatch.setattr(models, "cpu_has_bf16", lambda: has_bf16)
    with caplog.at_level(logging.WARNING, logger="agent.backends.models"):
        models.warn_if_slow_bf16(bf16, device)
    assert ("float32" in caplog.text) is warned


def test_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path) -> None:
    cpuinfo, real_path = tmp_path / "cpuinfo", models.Path
    monkeypatch.setattr(models, "Path", lambda p: cpuinfo if p == "/proc/cpuinfo" else real_path(p))
    cpuinfo.write_text("flags\t: fpu avx2 avx512f\n")
    assert not models.cpu_has_bf16()
    cpuinfo.write_text("flags\t: fpu avx2 avx512f avx512_bf16\n")
    assert models.cpu_has_bf16()
