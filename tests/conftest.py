"""Shared fixtures: specs, calibration and small hand-built workloads."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from ovsim.hw.calib import Calibration, load_calibration
from ovsim.hw.spec import GpuSpec, SystemSpec, load_gpu

# Property tests draw the same examples on every run, so that a run (CI's included) passes or fails
# by the code alone; HYPOTHESIS_PROFILE=explore draws new ones each time, to look for failures.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def h100() -> GpuSpec:
    return load_gpu("h100-sxm5-80gb")


@pytest.fixture(scope="session")
def a100() -> GpuSpec:
    return load_gpu("a100-sxm4-40gb")


@pytest.fixture(scope="session")
def h100_calib(h100: GpuSpec) -> Calibration:
    return load_calibration(h100, "h100-sxm5-80gb")


@pytest.fixture(scope="session")
def h100_node() -> SystemSpec:
    return SystemSpec.model_validate({
        "schema": "ovsim.system/1", "name": "test-h100x8", "gpu": "h100-sxm5-80gb", "gpu_count": 8,
        "topology": "nvswitch", "sources": {"topology": "test fixture"},
    })
