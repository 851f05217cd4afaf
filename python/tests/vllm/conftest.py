"""Fixtures of the vLLM connector tests (run by scripts/vllm-tests.sh in the
vLLM venv; the cluster fixtures come from ../conftest.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import List

import pytest

from strata.bench.models import TINY, make_llama


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0, **TINY)


@pytest.fixture(scope="session")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same architecture, other weights: another model to vLLM."""
    return make_llama(tmp_path_factory.mktemp("other-llama"), seed=1, **TINY)


@pytest.fixture(scope="session")
def prompt() -> List[int]:
    """300 tokens: 9 full blocks of 32 and a partial one."""
    rng = random.Random(7)
    return [rng.randrange(2, 1024) for _ in range(300)]
