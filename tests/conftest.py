import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("R2M_NO_PROGRESS", "1")


@pytest.fixture
def repo_root() -> Path:
    return ROOT
