"""Shared pytest configuration: seeded hypothesis profiles sized for a 2-core CI machine."""

import os
import subprocess

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=50, deadline=None, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The suite never reaches the Hugging Face Hub: a test of Hub ids points HF_ENDPOINT at a local server and turns this
# off in its own process (tests/test_hub.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def lerobot_python():
    """The python of a venv with real LeRobot (``MMFEED_LEROBOT_PYTHON``); the test skips, saying why, without."""
    from mmfeed.bench.lerobot_child import _lib_dirs

    python = os.environ.get("MMFEED_LEROBOT_PYTHON")
    if not python:
        pytest.skip("set MMFEED_LEROBOT_PYTHON to a venv python with lerobot installed to compare with real LeRobot")
    if not os.path.exists(python):
        pytest.skip(f"MMFEED_LEROBOT_PYTHON={python} does not exist")
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(_lib_dirs(python))}
    env.pop("PYTHONPATH", None)
    probe = subprocess.run([python, "-c", "import lerobot.datasets.lerobot_dataset, torchcodec.decoders"], env=env,
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"lerobot does not import under {python}: {probe.stderr.strip().splitlines()[-1:]}")
    return python
