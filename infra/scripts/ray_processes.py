"""The Ray processes of the training container (ray_common.sh ray_local_gcs_addresses, no_ray_process), read from
/proc in plain Python: no Ray import, so it is fast and works whatever Ray version the image holds.

Runs in the container with its python3 (`docker exec -i <container> python3 - MODE < ray_processes.py`).
  gcs  the GCS address (ip:port) of every raylet, one per line: the scan Ray itself uses to find a local cluster
  all  every live Ray process (`<pid> <name>`), matched as `ray stop` matches them (by process name, or by the
       script a Python process runs) plus the dashboard's modules, which outlive the raylet by a moment
"""

from __future__ import annotations

import os
import sys

NAMES = (b"raylet", b"plasma_store", b"gcs_server", b"ray::", b"ray-dashboard")
SCRIPTS = (b"monitor.py", b"ray.util.client.server", b"default_worker.py", b"setup_worker.py", b"reporter.py",
           b"dashboard/agent.py", b"dashboard/dashboard.py", b"runtime_env/agent/main.py", b"ray_process_reaper.py")


def ray_processes(mode: str) -> list[str]:
    found: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/" + pid + "/cmdline", "rb") as handle:
                args = handle.read().split(b"\0")
            with open("/proc/" + pid + "/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        name, state = stat[stat.find(b"(") + 1 : stat.rfind(b")")], stat[stat.rfind(b")") + 2 :][:1]
        if state == b"Z":
            continue  # already dead: only its parent has not collected it (a container without an init)
        if mode == "gcs" and b"raylet" in os.path.basename(args[0]):
            for arg in args:
                for word in arg.split(b" "):
                    if word.startswith(b"--gcs-address="):
                        found.add(word.split(b"=", 1)[1].decode())
        elif mode == "all" and (any(n in name for n in NAMES)
                                or any(a.endswith(s) for a in args[1:3] for s in SCRIPTS)):
            found.add(pid + " " + name.decode(errors="replace"))
    return sorted(found)


def main() -> None:
    print("\n".join(ray_processes(sys.argv[1])))


if __name__ == "__main__":
    main()
