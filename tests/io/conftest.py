"""The io tests write a deployed ServerApp's results under their own temporary folder."""

import pytest


@pytest.fixture(autouse=True)
def _result_root(tmp_path, monkeypatch):
    """What the server host's FEDCLUST_RESULT_ROOT does: the app's output folder."""
    monkeypatch.setenv("FEDCLUST_RESULT_ROOT", str(tmp_path))
