import pytest

from .cases import OWN_CONFIGS


@pytest.fixture(scope="module")
def configs(gemma4_bench):
    return {**gemma4_bench.PRESETS, **OWN_CONFIGS}
