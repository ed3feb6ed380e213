import os
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Synthetic data goes to a per-session cache, never the user's ~/.cache."""
    cache = os.environ.get("SUITE_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("suite-cache"))
    old = os.environ.get("SUITE_CACHE_DIR")
    os.environ["SUITE_CACHE_DIR"] = cache
    yield Path(cache)
    if old is None:
        os.environ.pop("SUITE_CACHE_DIR", None)
    else:
        os.environ["SUITE_CACHE_DIR"] = old


@pytest.fixture
def test_plugins(monkeypatch):
    """Make the stand-in plugins of tests/plugins visible here and in spawned run processes."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    import importlib

    importlib.invalidate_caches()
    yield
    sys.modules.pop("suite_test_plugins", None)
