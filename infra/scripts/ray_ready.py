"""The readiness gate's driver (ray_ready.sh wait_until_ready): connects once and reads ray.nodes() (public API, any
Ray version) until the cluster matches. Prints one line per change of the cluster's shape; on timeout the last line
says why it is not ready (exit 3). A live node that is not among the expected ones is asked to leave.

Runs in the head's container with its python3 (`docker exec -i ... python3 - ARGS < ray_ready.py`); arguments:
GCS_ADDRESS EXPECTED_IPS GPUS_PER_NODE TIMEOUT_S INTERVAL_S RESOURCE HEAD_GPUS RECORD_DIR.
"""

from __future__ import annotations

import sys
import time
from typing import Any

address, expected_text, gpus_text, timeout_text, interval_text, resource, head_gpus_text, record_dir = sys.argv[1:9]
expected = expected_text.split()
gpus_per_node = float(gpus_text)
head = address.rsplit(":", 1)[0]
wanted = {ip: float(head_gpus_text) if ip == head else gpus_per_node for ip in expected}
deadline = time.monotonic() + float(timeout_text)
import ray  # type: ignore[import-not-found]  # noqa: E402  (after the arguments: a bad call fails before Ray loads)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # type: ignore[import-not-found]  # noqa: E402

ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)


@ray.remote(num_cpus=0, max_retries=0)  # type: ignore[untyped-decorator]
def leave_cluster(record: str) -> None:
    # On the unexpected node, in its container: forget how Ray was started (the main process would start it
    # again), then a graceful "ray stop", detached: it ends this worker too.
    import contextlib
    import os
    import subprocess
    for name in ("start", "settings"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(record, name))
    subprocess.Popen(["ray", "stop"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


stopping: set[str] = set()


def shape() -> tuple[list[str], str]:
    alive: dict[str, list[float]] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            alive.setdefault(node["NodeManagerAddress"], []).append(node.get("Resources", {}).get(resource, 0.0))
            if node["NodeManagerAddress"] not in expected and node["NodeID"] not in stopping:
                stopping.add(node["NodeID"])
                print(f"stopping Ray on {node['NodeManagerAddress']}: not a node of this cluster any more",
                      flush=True)
                leave_cluster.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                    node_id=node["NodeID"], soft=False)).remote(record_dir)
    missing = [ip for ip in expected if ip not in alive]
    unexpected = sorted(ip for ip in alive if ip not in expected)
    duplicated = sorted(ip for ip, gpus in alive.items() if len(gpus) > 1)
    wrong_gpus: dict[float, list[str]] = {}
    for ip, gpus in sorted(alive.items()):
        if ip in expected and len(gpus) == 1 and gpus[0] != wanted[ip]:
            wrong_gpus.setdefault(wanted[ip], []).append(f"{ip} has {gpus[0]:g}")
    total = sum(sum(gpus) for ip, gpus in alive.items() if ip in expected)
    problems = []
    if missing:
        problems.append("missing nodes: " + " ".join(missing))
    for count, nodes in sorted(wrong_gpus.items()):
        problems.append(f"nodes without {count:g} {resource}s: {', '.join(nodes)}")
    if unexpected:
        problems.append("unexpected alive nodes: " + " ".join(unexpected))
    if duplicated:
        problems.append("several alive Ray nodes on: " + " ".join(duplicated))
    want = sum(wanted.values())
    summary = f"{len(expected) - len(missing)} of {len(expected)} nodes, {total:g} of {want:g} {resource}s"
    if total < want:
        summary += f" (short by {want - total:g})"
    return problems, summary


last: Any = None
while True:
    problems, summary = shape()
    line = summary + ("; " + "; ".join(problems) if problems else "")
    if not problems:
        print("cluster ready: " + summary, flush=True)
        sys.exit(0)
    if time.monotonic() >= deadline:
        print("not ready: " + line, flush=True)
        sys.exit(3)
    if line != last:
        print("waiting: " + line, flush=True)
        last = line
    time.sleep(float(interval_text))
