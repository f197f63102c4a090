"""Whether the program runs under the offline cloud (devtools/offline_cloud.py sets ROLL_CLUSTER_OFFLINE=1 for the
plan and the tests): then no login key is read, no ssh-agent is asked and no host is looked at over SSH."""

from __future__ import annotations

import os

OFFLINE_ENV = "ROLL_CLUSTER_OFFLINE"


def offline() -> bool:
    return os.environ.get(OFFLINE_ENV) == "1"
