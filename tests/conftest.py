"""Hermetic ROLL base configs for the whole suite: the snapshot of the pinned ref shipped with the tests
(tests/fixtures/roll) stands for a ROLL checkout, as in the offline plan, and no test reaches the network for
them (a test of the fetch code serves files from a local HTTP server)."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from script_harness import FakeNode

from devtools.offline_cloud import ROLL_SNAPSHOT

os.environ.setdefault("ROLL_CHECKOUT", str(ROLL_SNAPSHOT))


@pytest.fixture(autouse=True)
def _no_network_for_roll_configs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = urllib.request.urlopen

    def local_only(url: Any, *args: Any, **kwargs: Any) -> Any:
        text = url if isinstance(url, str) else url.full_url
        if not text.startswith(("http://127.0.0.1", "http://localhost")):
            raise AssertionError(f"a test tried to reach the network: {text}")
        return real(url, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", local_only)
    yield


@pytest.fixture(autouse=True)
def _plan_asks_no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's manifest look-up (devtools/registry.py) is off in every test, so no plan's figures depend on the
    network (or its absence); tests/infra/test_image_manifest.py turns it on against its stand-in registry."""
    monkeypatch.setenv("ROLL_CLUSTER_NO_REGISTRY", "1")


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    """A node for the node scripts: a directory tree with the project's stand-ins (tests/helpers/script_harness.py)."""
    return FakeNode(tmp_path)
