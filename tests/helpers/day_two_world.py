"""The machines a day-two `pulumi up` reaches, for the engine model (devtools/engine_model.py).

The engine model decides what an `up`, a refresh or a destroy does and in which order; this world performs those
steps: instances come and go with their addresses and host keys, Ray's membership and the jobs change as the steps
say, and the admin machine's own scripts really run (infra/scripts/local/known_hosts.sh, teardown.sh) with an ssh
stand-in that checks host keys strictly like OpenSSH, against a HOME of their own. The readiness gate's own driver
(infra/scripts/ray_ready.sh) runs against a stand-in `ray` module that reads this world. What is modelled, not run:
the remote steps other than the gate (their effect on Ray and the jobs, by step: ray-head and ray-worker join,
the job step submits as job_submit.sh does and refuses an id Ray holds as STOPPED or FAILED).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devtools import engine_model
from devtools.offline_cloud import OfflineCloud, Registered, unwrap
from infra.layout import PROJECT_DIR
from infra.node import remote

INSTANCE = "alicloud:ecs/instance:Instance"
SCRIPTS = PROJECT_DIR / "infra" / "scripts"

# The ssh stand-in: OpenSSH's answers for an unreachable host, a strict host-key check, and then the teardown's
# remote step, whose effect on the world it applies by its ROLL_CLUSTER_STEP.
SSH_STANDIN = r'''#!/usr/bin/env python3
import json, os, sys
args, options, port = sys.argv[1:], {}, "22"
while args and args[0].startswith("-") and args[0] != "--":
    flag = args.pop(0)
    if flag == "-o":
        key, _, value = args.pop(0).partition("=")
        options[key] = value
    elif flag in ("-p", "-i", "-l", "-F"):
        value = args.pop(0)
        options[flag] = value
        if flag == "-p":
            port = value
if args and args[0] == "--":
    args.pop(0)
host = args.pop(0).split("@", 1)[-1]
world_file = os.environ["DAY_TWO_WORLD"]
world = json.load(open(world_file))
machine = next((m for m in world["machines"].values() if m["public_ip"] == host and m["running"]), None)
if machine is None:
    sys.stderr.write("ssh: connect to host %s port %s: Connection timed out\n" % (host, port))
    sys.exit(255)
if options.get("StrictHostKeyChecking") == "yes":
    known = os.path.expanduser(options.get("UserKnownHostsFile", "~/.ssh/known_hosts"))
    pattern = host if port == "22" else "[%s]:%s" % (host, port)
    keys = []
    if os.path.exists(known):
        for line in open(known):
            parts = line.split()
            if len(parts) >= 3 and parts[0] == pattern:
                keys.append(parts[1] + " " + parts[2])
    presented = " ".join(machine["host_key"].split()[:2])
    if not keys:
        sys.stderr.write("No ED25519 host key is known for %s and you have requested strict checking.\n"
                         "Host key verification failed.\n" % pattern)
        sys.exit(255)
    if presented not in keys:
        sys.stderr.write("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.\n")
        sys.exit(255)
identity = options.get("-i")
if world["identities"] and identity is not None:
    authorized = os.path.join(machine["home"], ".ssh", "authorized_keys")
    accepted = open(authorized).read() if os.path.exists(authorized) else ""
    if not os.path.exists(identity):
        sys.stderr.write("Warning: Identity file %s not accessible: No such file or directory.\n" % identity)
    if not os.path.exists(identity) or world["identities"].get(identity, "-").split()[1] not in accepted:
        sys.stderr.write("%s@%s: Permission denied (publickey).\n" % ("root", host))
        sys.exit(255)
text = sys.stdin.read() if args != ["true"] else ""
step = os.environ.get("ROLL_CLUSTER_STEP", "")
if step.startswith("login-key-"):  # the real remote half, on the node's own HOME
    import subprocess
    sys.exit(subprocess.run(["sh", "-s"], input=text, text=True, env={"HOME": machine["home"],
                                                                      "PATH": os.environ["PATH"]}).returncode)
if args == ["true"]:
    sys.exit(0)
world["log"].append("%s on %s" % (step, machine["name"]))
if step in ("ray-head-delete", "ray-worker-delete"):
    world["ray"] = [ip for ip in world["ray"] if ip != machine["private_ip"]]
    machine["ray_record"] = False
elif step == "job-delete":
    job = [l for l in text.splitlines() if l.startswith("export JOB_ID=")][0].split("=", 1)[1].strip("'")
    if world["jobs"].get(job) == "RUNNING":
        world["jobs"][job] = "STOPPED"
    # job_stop.sh deletes the job it stopped (or found stopped or failed), so that its id can be submitted again.
    # The step's text names the library files it sources (<library>/<hash>/<script>.sh): read what they hold.
    import re
    sourced = "".join(open(os.path.join(os.environ["DAY_TWO_SCRIPTS"], name)).read()
                      for name in re.findall(r"/([A-Za-z0-9_]+[.]sh)\b", text)
                      if os.path.exists(os.path.join(os.environ["DAY_TWO_SCRIPTS"], name)))
    if "forget_ended_job" in text + sourced and world["jobs"].get(job) in ("STOPPED", "FAILED"):
        del world["jobs"][job]
json.dump(world, open(world_file, "w"))
'''

# The `ray` module the gate's driver imports: ray.nodes() from the world; a task pinned to a node runs its
# function with the `ray` command of that node (RAY_STANDIN_BIN/ray: `ray stop` leaves the cluster).
RAY_MODULE = r'''
import json, os
def init(**_):
    pass
def _world():
    return json.load(open(os.environ["DAY_TWO_WORLD"]))
def nodes():
    world = _world()
    return [{"NodeID": "id-" + ip, "NodeManagerAddress": ip, "Alive": True,
             "Resources": {"GPU": float(world["gpus_per_node"])}} for ip in world["ray"]]
class _Remote:
    def __init__(self, function, strategy=None):
        self.function, self.strategy = function, strategy
    def options(self, scheduling_strategy=None, **_):
        return _Remote(self.function, scheduling_strategy)
    def remote(self, *args):
        # The task runs here, as on its node; the processes it starts (a detached `ray stop`) are awaited, so that
        # the world file has one writer at a time (many nodes leaving at once would race on it otherwise). A real
        # node leaves on its own time; the gate polls until it has either way.
        import subprocess
        node = self.strategy.node_id[len("id-"):]
        os.environ["RAY_STANDIN_NODE"] = node
        started, popen = [], subprocess.Popen
        class Recorded(popen):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                started.append(self)
        subprocess.Popen = Recorded
        try:
            self.function(*args)
        finally:
            subprocess.Popen = popen
            for process in started:
                process.wait()
            os.environ.pop("RAY_STANDIN_NODE")
def remote(*args, **kwargs):
    if args and callable(args[0]):
        return _Remote(args[0])
    return lambda function: _Remote(function)
'''
SCHEDULING_MODULE = r'''
class NodeAffinitySchedulingStrategy:
    def __init__(self, node_id, soft):
        assert soft is False
        self.node_id = node_id
'''
RAY_COMMAND = r'''#!/usr/bin/env python3
import json, os, sys
if sys.argv[1:] == ["stop"]:
    path = os.environ["DAY_TWO_WORLD"]
    world = json.load(open(path))
    world["ray"] = [ip for ip in world["ray"] if ip != os.environ["RAY_STANDIN_NODE"]]
    for machine in world["machines"].values():
        if machine["private_ip"] == os.environ["RAY_STANDIN_NODE"]:
            machine["ray_record"] = False
    world["log"].append("ray stop on " + os.environ["RAY_STANDIN_NODE"])
    json.dump(world, open(path, "w"))
'''


@dataclass
class Machine:
    name: str  # the node (node-1)
    public_ip: str
    private_ip: str
    host_key: str  # the public key it presents (installed by its first boot)
    home: str = ""  # the login user's HOME on it: .ssh/authorized_keys (access.sshPublicKey, by its first boot)
    running: bool = True
    # Ray's start record in its container (ray_common.sh): the container's main process starts Ray from it
    # when the machine starts again (container_main.sh); the ray-stop step and the gate's stop remove it.
    ray_record: bool = False


@dataclass
class World:
    root: Path
    machines: dict[str, Machine] = field(default_factory=dict)  # by instance id
    ray: list[str] = field(default_factory=list)  # private IPs of the alive Ray nodes
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> RUNNING | STOPPED | FAILED | SUCCEEDED
    gpus_per_node: int = 0
    log: list[str] = field(default_factory=list)
    # Login keys: identity file -> public key, and the one access.sshPrivateKeyPath names now ("": not modelled).
    identities: dict[str, str] = field(default_factory=dict)
    login: str = ""

    def __post_init__(self) -> None:
        self.home = self.root / "home"  # the admin machine's HOME (its ~/.ssh/roll-cluster)
        self.bin = self.root / "bin"
        self.lib = self.root / "pylib"
        self.record = self.root / "ray-record"
        for folder in (self.home, self.bin, self.lib / "ray" / "util", self.record):
            folder.mkdir(parents=True, exist_ok=True)
        _write(self.bin / "ssh", SSH_STANDIN, executable=True)
        _write(self.bin / "ray", RAY_COMMAND, executable=True)
        # The Pulumi CLI as nas_guard.sh asks it: storage.retainOnDestroy is unset (its default, true).
        _write(self.bin / "pulumi", "#!/bin/sh\necho \"error: configuration key 'roll-cluster:storage' not found\" >&2"
               "\nexit 255\n", executable=True)
        _write(self.lib / "ray" / "__init__.py", RAY_MODULE)
        _write(self.lib / "ray" / "util" / "__init__.py", "")
        _write(self.lib / "ray" / "util" / "scheduling_strategies.py", SCHEDULING_MODULE)

    # ------------------------------------------------------------------ the world file the stand-ins share
    @property
    def file(self) -> Path:
        return self.root / "world.json"

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "root"}
        self.file.write_text(json.dumps(data))

    def load(self) -> None:
        data = json.loads(self.file.read_text())
        self.machines = {k: Machine(**v) for k, v in data["machines"].items()}
        self.ray, self.jobs, self.log = data["ray"], data["jobs"], data["log"]
        self.identities, self.login = data["identities"], data["login"]

    def env(self, home: Path | None = None) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(home or self.home),
                "DAY_TWO_WORLD": str(self.file), "DAY_TWO_SCRIPTS": str(SCRIPTS),
                "ROLL_CLUSTER_LOG_DIR": str(self.root / "logs"), "TMPDIR": str(self.root)}

    # ------------------------------------------------------------------ queries
    def at(self, host: str) -> Machine | None:
        return next((m for m in self.machines.values() if m.public_ip == host and m.running), None)

    def autostop(self) -> None:
        """The head's autostop (or a pause outside Pulumi): StopInstances with StopCharging releases the public IPs;
        Ray and the job end with the machines."""
        for machine in self.machines.values():
            machine.running, machine.public_ip = False, ""
            self._stopped(machine.private_ip)

    def read_instance(self, r: Registered) -> dict[str, Any] | None:
        """DescribeInstances, as a refresh reads an instance: gone, stopped (no public IP) or running."""
        machine = self.machines.get(str(r.id))
        if machine is None:
            return None
        if not machine.running:
            return {**r.outputs, "status": "Stopped", "publicIp": ""}
        return {**r.outputs, "status": "Running", "publicIp": machine.public_ip}

    # ------------------------------------------------------------------ the engine's steps
    def up(self, cloud: OfflineCloud, home: Path | None = None) -> engine_model.Executed:
        """Perform the `up` the engine model decided for `cloud` (its ops), in order; stops at the first failure."""
        prior = {r.name: r for r in cloud.prior}
        return engine_model.execute(cloud.ops, lambda verb, name: self.perform(cloud, prior, verb, name, home))

    def refresh(self, resources: Sequence[Registered],
                targets: Callable[[Any], bool] = lambda _: True) -> engine_model.Refreshed:
        return engine_model.refresh(resources, lambda host: self.at(host) is not None, self.read_instance, targets)

    def destroy(self, resources: Sequence[Registered], home: Path | None = None) -> engine_model.Destroyed:
        """`pulumi destroy`: the engine model's order; teardowns run for real, instances go."""
        def local(r: Registered) -> str | None:
            if r.type == INSTANCE:
                self.machines.pop(str(r.id), None)
                return None
            if r.type == "command:local:Command" and unwrap(r.inputs.get("delete")):
                return self._run_local(r, "delete", home)
            return None
        unreachable = {m.public_ip for m in self.machines.values() if not m.running}
        return engine_model.destroy(resources, unreachable, local)

    def perform(self, cloud: OfflineCloud, prior: dict[str, Registered], verb: str, name: str,
                home: Path | None = None) -> str | None:
        r = prior[name] if verb == "delete" else cloud.named(name)
        if r.type == INSTANCE:
            return self._instance(cloud, r, verb)
        if r.type == "command:local:Command":
            if verb == "delete" and unwrap(r.inputs.get("delete")):
                return self._run_local(r, "delete", home)
            if verb != "delete" and (name == "known-hosts" or name.endswith("-login-key")):
                return self._run_local(r, "create", home, previous=prior.get(name) if verb == "update" else None)
            return None
        if r.type == "command:remote:Command" and verb != "delete":
            return self._remote(r)
        if r.type.startswith("docker:index/"):
            return self._docker(cloud, prior, r, verb)
        return None

    def _docker(self, cloud: OfflineCloud, prior: dict[str, Registered], r: Registered, verb: str) -> str | None:
        """A docker resource's create or delete dials its provider's host: the provider as this run configured it
        (an updated provider keeps its id and is configured anew). A delete is skipped when the resource it is
        deleted with goes in this run (step.go); an image kept locally is not removed (no call, UNCONFIRMED).
        See verified-facts#day-two-world-step."""
        if verb == "delete":
            reg = r.registration
            going = {n for v, n in cloud.ops if v == "delete"} | {n for n, c in cloud.changes.items() if c == "replace"}
            if (reg is not None and reg.deleted_with in going) or unwrap(r.inputs.get("keepLocally")):
                return None
        provider_name = engine_model.name_of(str(r.provider).rsplit("::", 1)[0])
        provider = next((p for p in cloud.resources if p.name == provider_name), prior.get(provider_name))
        host = engine_model.provider_host(provider.inputs) if provider is not None else None
        if host is None or self.at(host) is None:
            return f"{r.name}: error during connect: ssh: connect to host {host} port 22: Connection timed out"
        return None

    def _instance(self, cloud: OfflineCloud, r: Registered, verb: str) -> str | None:
        if verb == "delete":
            self.machines.pop(str(r.id), None)
            return None
        node = r.name.removesuffix("-instance")
        host_key = str(unwrap(cloud.named(f"{node}-host-key").outputs["stdout"])).strip().splitlines()[-1]
        running = r.outputs.get("status") != "Stopped"
        old = self.machines.get(str(r.id))
        home = old.home if old else str(self.root / "nodes" / str(r.id))
        if old is None and self.login:  # first boot: access.sshPublicKey into authorized_keys
            (Path(home) / ".ssh").mkdir(parents=True, exist_ok=True)
            (Path(home) / ".ssh" / "authorized_keys").write_text(self.identities[self.login] + "\n")
        machine = Machine(node, str(r.outputs.get("publicIp") or ""), str(r.outputs["privateIp"]),
                          old.host_key if old else host_key, home, running, old.ray_record if old else False)
        self.machines[str(r.id)] = machine
        if not running:
            self._stopped(machine.private_ip)
        elif old is not None and not old.running and machine.ray_record and machine.private_ip not in self.ray:
            self.ray.append(machine.private_ip)  # Docker restarts the container, its main process starts Ray
        return None

    def _stopped(self, private_ip: str) -> None:
        """A machine stopped: its raylet is gone; with the head's, so is the cluster and every job (Ray keeps no job
        across a restart of its head)."""
        self.ray = [ip for ip in self.ray if ip != private_ip]
        if not self.ray:
            self.jobs = {}

    def _remote(self, r: Registered) -> str | None:
        connection = unwrap(r.inputs["connection"])
        host = str(connection["host"])
        machine = self.at(host)
        if machine is None:
            return f"{r.name}: dial tcp {host}:22: i/o timeout"
        wanted = " ".join(str(connection.get("hostKey") or machine.host_key).split()[:2])
        if wanted != " ".join(machine.host_key.split()[:2]):
            return f"{r.name}: ssh: handshake failed: ssh: host key mismatch"
        if self.login and self.identities[self.login].split()[1] not in self._authorized(machine):
            # The step's connection signs with the configured key (its privateKey in the state).
            return (f"{r.name}: ssh: handshake failed: ssh: unable to authenticate, attempted methods [none "
                    "publickey], no supported methods remain")
        env = remote.exported_env(str(unwrap(r.inputs["stdin"])))
        step = env.get("ROLL_CLUSTER_STEP", "")
        self.log.append(f"{step} on {machine.name}")
        if step in ("ray-head", "ray-worker"):
            machine.ray_record = True
            if machine.private_ip not in self.ray:
                self.ray.append(machine.private_ip)
        elif step == "ray-ready":
            return self._ready_gate(r.name, env)
        elif step == "job":
            job = env["JOB_ID"]
            if self.jobs.get(job) in ("STOPPED", "FAILED"):  # job_submit.sh check_existing_job
                return (f"{r.name}: job {job} already exists and is {self.jobs[job]}. Fix the cause, then delete "
                        "the job ... or give the job a new id, and run again")
            if env["JOB_HEAD_IP"] not in self.ray:
                return f"{r.name}: nothing answers on the Jobs API port: Ray is not running on the head"
            if self.jobs.get(job) not in ("RUNNING", "SUCCEEDED"):
                self.jobs[job] = "RUNNING"
        return None

    @staticmethod
    def _authorized(machine: Machine) -> str:
        path = Path(machine.home) / ".ssh" / "authorized_keys"
        return path.read_text() if path.is_file() else ""

    def _ready_gate(self, name: str, env: dict[str, str]) -> str | None:
        """The gate's own driver (ray_ready.py) against this world's Ray."""
        self.gpus_per_node = int(env["GPUS_PER_NODE"])
        self.save()
        driver = (SCRIPTS / "ray_ready.py").read_text()
        arguments = [f"{env['HEAD_IP']}:{env['GCS_PORT']}", env["EXPECTED_NODE_IPS"], env["GPUS_PER_NODE"], "120",
                     "0.05", env.get("ACCELERATOR_RESOURCE", "GPU"), env.get("HEAD_GPUS", env["GPUS_PER_NODE"]),
                     str(self.record)]
        done = subprocess.run([sys.executable, "-c", driver, *arguments], capture_output=True, text=True,
                              env={**self.env(), "PYTHONPATH": str(self.lib)}, timeout=120, check=False)
        self.load()
        if done.returncode != 0:
            last = (done.stdout.strip().splitlines() or [done.stderr.strip()])[-1]
            return f"{name}: cluster not ready: {last.removeprefix('not ready: ')}"
        return None

    def _run_local(self, r: Registered, which: str, home: Path | None,
                   previous: Registered | None = None) -> str | None:
        """A local.Command's create or delete as pulumi-command runs it: `/bin/sh -c`, in the project root, with
        its `environment` (local/commandOutputs.go); an update gets the previous stdout as
        PULUMI_COMMAND_STDOUT when addPreviousOutputInEnv. Its stdout becomes its output.
        See verified-facts#day-two-world-commandoutputs."""
        self.save()
        command = str(unwrap(r.inputs[which]))
        environment = {k: str(unwrap(v)) for k, v in (unwrap(r.inputs.get("environment")) or {}).items()}
        if previous is not None and unwrap(r.inputs.get("addPreviousOutputInEnv")) is not False \
                and previous.outputs.get("stdout"):
            environment["PULUMI_COMMAND_STDOUT"] = str(unwrap(previous.outputs["stdout"]))
        done = subprocess.run(["/bin/sh", "-c", command], cwd=PROJECT_DIR, capture_output=True, text=True,
                              env={**self.env(home), **environment}, timeout=300, check=False)
        self.load()
        if done.returncode != 0:
            return f"{r.name}: {(done.stdout + done.stderr).strip()[-1500:]}"
        if which == "create":
            r.outputs["stdout"] = done.stdout
        return None


def _write(path: Path, text: str, executable: bool = False) -> None:
    path.write_text(text)
    if executable:
        path.chmod(0o755)


def expected_ips(cloud: OfflineCloud) -> list[str]:
    """The private IPs of the instances the configuration has (the nodes Ray should be formed on)."""
    return sorted(str(r.outputs["privateIp"]) for r in cloud.of_type(INSTANCE))


def job_id(cloud: OfflineCloud) -> str:
    return remote.exported_env(str(unwrap(cloud.named("training-job").inputs["stdin"])))["JOB_ID"]


def matches(pattern: str) -> Callable[[Registered], bool]:
    return lambda r: engine_model.urn_glob(pattern, r.type, r.name)


__all__ = ["Machine", "World", "expected_ips", "job_id", "matches"]
