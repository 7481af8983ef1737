"""Test-wide settings: offline, quiet, a throwaway kbrouter cache unless one is given."""

import os

for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}.items():
    os.environ.setdefault(key, value)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# The shared real data: $KBROUTER_SHARED_DATA, else ../shared/data next to the repo. Every test module takes it from here.
SHARED = Path(os.environ.get("KBROUTER_SHARED_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared real data folder (`SHARED`); tests that need it skip when it is absent."""
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED} (set KBROUTER_SHARED_DATA to its folder)")
    return SHARED


@pytest.fixture
def shared_path():
    """Return a function giving a path under `SHARED` that skips the test when that data is absent."""

    def get(*parts: str) -> Path:
        path = SHARED.joinpath(*parts)
        if not path.exists():
            pytest.skip(f"shared data {path} is absent (set KBROUTER_SHARED_DATA to its folder)")
        return path

    return get


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct as a cached safetensors folder (converted from the packaged GGUF once)."""
    from agent.backends.models import smollm2_path

    return smollm2_path()


@pytest.fixture(scope="session")
def load_script():
    """`load_script("scripts/x.py")`: a repo script (not a package module) imported by path, for tests of its functions."""
    import importlib.util

    def load(relpath: str):
        path = Path(__file__).resolve().parents[1] / relpath
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
