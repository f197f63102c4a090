"""Alibaba's Python SDK for the autostop stopper, installed by the node's own installation (autostop.sh
AUTOSTOP_ACTION=sdk, as the step runs it on the head) into a virtualenv outside the repository, kept between runs
and keyed by the requirements file's hash (like tests/helpers/e2e_docker.py's test image). Under /var/cache: the
real-host tier's hosts see it at the same path (their /tmp is private)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

from infra.autostop import AUTOSTOP_SCRIPTS, SDK_REQUIREMENTS, file_b64
from infra.node.remote import local_library, render_plain

SDK_ROOT = Path(os.environ.get("ROLL_CLUSTER_TEST_AUTOSTOP_SDK_ROOT", "/var/cache/roll-cluster-tests"))


def sdk_dir() -> Path:
    return SDK_ROOT / f"autostop-sdk-{hashlib.sha256(SDK_REQUIREMENTS.read_bytes()).hexdigest()[:16]}"


def ensure_autostop_sdk() -> Path:
    """The virtualenv (made once; later runs find the node's marker and skip). Needs the package index once."""
    target = sdk_dir()
    SDK_ROOT.mkdir(parents=True, exist_ok=True)
    log_dir = SDK_ROOT / "logs"
    with open(SDK_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time (parallel test runs)
        command = render_plain("autostop-sdk", AUTOSTOP_SCRIPTS, {
            "AUTOSTOP_ACTION": "sdk", "AUTOSTOP_SDK_DIR": str(target),
            "AUTOSTOP_SDK_REQUIREMENTS_B64": file_b64(SDK_REQUIREMENTS)}, library=local_library())
        env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("PATH", "HOME")}
        result = subprocess.run(["bash", "-c", command], env={**env, "ROLL_CLUSTER_LOG_DIR": str(log_dir)},
                                capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"installing the autostop SDK failed:\n{result.stdout}\n{result.stderr}"
    return target
