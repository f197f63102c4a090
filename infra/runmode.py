"""Whether the program runs under the offline cloud (devtools/offline_cloud.py sets ROLL_CLUSTER_OFFLINE=1 for the
plan and the tests): then no login key is read, no ssh-agent is asked and no host is looked at over SSH."""

from __future__ import annotations

import os

OFFLINE_ENV = "ROLL_CLUSTER_OFFLINE"


def offline() -> bool:
    return os.environ.get(OFFLINE_ENV) == "1"


# What the offline cloud hands the program for a `secure:` value of the stack file, which it cannot decrypt
# (devtools/offline_cloud.py); the key is still marked secret. stack_config.load() names each such key in the plan's
# warnings: its value is checked by `pulumi preview` and `up`, where Pulumi decrypts it.
UNDECRYPTED = "<secret: not decrypted offline>"
