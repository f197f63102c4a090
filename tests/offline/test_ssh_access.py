"""SSH to the nodes (issue 9, point 1): the login key reaches root whatever its type, passphrase and agent-only
keys work through ssh-agent or are refused up front, and every SSH client verifies a host key the program
generated before the node existed."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
from pathlib import Path

import pytest
from offline_helpers import INSTANCE, LOCAL, REMOTE, custom_resources, run

from components import remote_steps
from devtools import offline_cloud as offline
from devtools.offline_cloud import OfflineCloud, is_secret, reveal, unwrap
from infra.config import ConfigError
from infra.node import known_hosts, ssh_access, steps
from infra.sources.alibaba.user_data import decode_user_data

REPO = Path(__file__).resolve().parents[2]
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def keygen(tmp_path: Path, name: str, key_type: str = "ed25519", passphrase: str = "", fmt: str = "") -> Path:
    path = tmp_path / name
    command = ["ssh-keygen", "-q", "-t", key_type, "-N", passphrase, "-f", str(path), "-C", name]
    if fmt:
        command += ["-m", fmt]
    subprocess.run(command, check=True, capture_output=True)
    return path


def user_data(instance: offline.Registered) -> str:
    return decode_user_data(str(reveal(instance.inputs["userData"])))


def user_data_env(instance: offline.Registered) -> dict[str, str]:
    """The exports at the top of the first-boot user data (values may span lines: the host key)."""
    preamble = user_data(instance).split("\n# ---- ", 1)[0].removeprefix("#!/bin/bash\n")
    words = shlex.split(preamble)
    return dict(w.split("=", 1) for w in words if w != "export")


# ---------------------------------------------------------------------------------------------------- login key


def test_an_ed25519_key_reaches_root_through_user_data_without_an_ecs_key_pair() -> None:
    result = run("dev")  # the shipped stacks carry an ed25519 key, which ImportKeyPair refuses

    assert result.cloud.of_type("alicloud:ecs/ecsKeyPair:EcsKeyPair") == []
    instance = result.cloud.of_type(INSTANCE)[0]
    assert instance.inputs.get("keyName") in (None, "")
    env = user_data_env(instance)
    assert env["ROOT_AUTHORIZED_KEY"].startswith("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5")


def test_an_rsa_key_also_gets_an_ecs_key_pair() -> None:
    rsa = subprocess.run(
        ["bash", "-c", "d=$(mktemp -d) && ssh-keygen -q -t rsa -b 2048 -N '' -f $d/k && cat $d/k.pub && rm -r $d"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()

    result = run("dev", config={"roll-cluster:access": {"sshPublicKey": rsa}})

    pair = result.cloud.of_type("alicloud:ecs/ecsKeyPair:EcsKeyPair")
    assert [unwrap(p.inputs["publicKey"]) for p in pair] == [rsa]
    assert user_data_env(result.cloud.of_type(INSTANCE)[0])["ROOT_AUTHORIZED_KEY"] == rsa


def test_the_offline_cloud_refuses_an_ed25519_key_pair_like_import_key_pair() -> None:
    with pytest.raises(offline.AlibabaRefused, match="ImportKeyPair refuses a ssh-ed25519 key"):
        offline._refuse_like_alibaba("alicloud:ecs/ecsKeyPair:EcsKeyPair", "key-pair", {"publicKey": ED25519})
    offline._refuse_like_alibaba("alicloud:ecs/ecsKeyPair:EcsKeyPair", "key-pair", {"publicKey": "ssh-rsa AAAA x"})


def test_a_security_key_type_is_refused_before_any_resource_with_the_fix() -> None:
    cloud = OfflineCloud()
    sk = "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIOMqqnkVzrm0 x"
    with pytest.raises(ConfigError, match=r"roll-cluster:access\.sshPublicKey: must not be a security-key type"):
        run("dev", cloud=cloud, config={"roll-cluster:access": {"sshPublicKey": sk}})
    assert custom_resources(cloud) == []


@pytest.mark.parametrize(("key_type", "fmt"), [("ed25519", ""), ("rsa", "PEM"), ("ecdsa", "PKCS8")])
def test_an_encrypted_private_key_is_recognised_in_every_format(tmp_path: Path, key_type: str, fmt: str) -> None:
    plain = keygen(tmp_path, "plain", key_type, fmt=fmt)
    locked = keygen(tmp_path, "locked", key_type, passphrase="correct horse", fmt=fmt)

    assert not ssh_access.is_encrypted(plain.read_text())
    assert ssh_access.is_encrypted(locked.read_text())


def test_a_passphrase_key_in_ssh_agent_signs_through_the_agent(tmp_path: Path) -> None:
    locked = keygen(tmp_path, "locked", passphrase="pw")
    public = (tmp_path / "locked.pub").read_text().strip()
    pub_file = tmp_path / "known" / "dev.agent-key.pub"

    login = ssh_access.login_key(str(locked), public, pub_file, agent_keys=lambda: [public])

    assert login.via_agent and login.private_key is None  # pulumi-command then uses $SSH_AUTH_SOCK
    assert login.identity_file == str(pub_file) and pub_file.read_text() == public + "\n"


def test_a_passphrase_key_not_in_the_agent_is_refused_up_front_with_the_fix(tmp_path: Path) -> None:
    locked = keygen(tmp_path, "locked", passphrase="pw")
    public = (tmp_path / "locked.pub").read_text().strip()

    with pytest.raises(ConfigError) as error:
        ssh_access.login_key(str(locked), public, tmp_path / "a.pub", agent_keys=lambda: ["ssh-rsa AAAAother x"])
    message = str(error.value)
    assert "roll-cluster:access.sshPrivateKeyPath" in message and "protected by a passphrase" in message
    assert f"ssh-add {locked}" in message and "holds 1 key(s), not this one" in message


def test_a_key_only_in_the_agent_works_and_a_missing_key_without_agent_is_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")

    login = ssh_access.login_key(missing, ED25519, tmp_path / "a.pub", agent_keys=lambda: [ED25519])
    assert login.via_agent and login.identity_file == str(tmp_path / "a.pub")

    with pytest.raises(ConfigError, match=r"no private key at .* and no ssh-agent answers"):
        ssh_access.login_key(missing, ED25519, tmp_path / "a.pub", agent_keys=lambda: None)


def test_a_plain_key_file_is_handed_to_pulumi_command(tmp_path: Path) -> None:
    plain = keygen(tmp_path, "plain")
    public = Path(f"{plain}.pub").read_text()  # the matching public key (a mismatch is refused)
    login = ssh_access.login_key(str(plain), public, tmp_path / "a.pub", agent_keys=lambda: None)
    assert login.private_key == plain.read_text() and login.identity_file == str(plain) and not login.via_agent


# ---------------------------------------------------------------------------------------------------- host keys


def test_host_key_script_prints_a_working_ed25519_key_pair(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(REPO / "infra/scripts/local/host_key.sh")], capture_output=True, text=True,
                          check=True, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "NODE_NAME": "node-0"})
    private, public = known_hosts.split_host_key(done.stdout)
    key_file = tmp_path / "k"
    key_file.write_text(private)
    key_file.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key_file)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == public.split()[:2]
    assert public.startswith("ssh-ed25519 ")
    assert list(tmp_path.iterdir()) == [key_file]  # its temporary directory is gone


def test_known_hosts_script_writes_a_private_file_and_removes_it_on_delete(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KNOWN_HOSTS_FILE": "~/.ssh/roll-cluster/dev.known_hosts",
           "KNOWN_HOSTS": "47.1.2.3 ssh-ed25519 AAAA\n[47.1.2.4]:2222 ssh-ed25519 BBBB"}
    script = str(REPO / "infra/scripts/local/known_hosts.sh")
    subprocess.run(["bash", script], env=env, check=True, capture_output=True)
    written = tmp_path / ".ssh/roll-cluster/dev.known_hosts"
    assert written.read_text() == "47.1.2.3 ssh-ed25519 AAAA\n[47.1.2.4]:2222 ssh-ed25519 BBBB\n"
    assert written.stat().st_mode & 0o777 == 0o600
    subprocess.run(["bash", script, "--delete"], env=env, check=True, capture_output=True)
    assert not written.exists()


def test_every_ssh_client_verifies_the_host_key_generated_for_its_node() -> None:
    result = run("multi")
    cloud = result.cloud
    public = {
        r.name.removesuffix("-host-key"): known_hosts.split_host_key(str(r.outputs["stdout"]))[1]
        for r in cloud.of_type(LOCAL) if r.name.endswith("-host-key")
    }
    assert sorted(public) == ["node-0", "node-1"]
    instances = {r.name.removesuffix("-instance"): r for r in cloud.of_type(INSTANCE)}
    ips = {n["name"]: n["publicIp"] for n in result.outputs["nodes"]}

    for node, key in public.items():
        # The node gets the private key through its user data, which is therefore a secret.
        assert is_secret(instances[node].inputs["userData"])
        env = user_data_env(instances[node])
        assert env["SSH_HOST_KEY_ED25519_PUB"] == key and "PRIVATE KEY" in env["SSH_HOST_KEY_ED25519"]
        # pulumi-command: every remote step of the node pins the key.
        steps = [r for r in cloud.of_type(REMOTE) if r.name.startswith(f"{node}-")]
        assert steps and all(unwrap(r.inputs["connection"])["hostKey"] == key for r in steps)

    written = cloud.named("known-hosts")
    assert unwrap(written.inputs["environment"])["KNOWN_HOSTS_FILE"] == "~/.ssh/roll-cluster/multi.known_hosts"
    lines = unwrap(written.inputs["environment"])["KNOWN_HOSTS"].splitlines()
    assert lines == [f"{ips[n]} {' '.join(public[n].split()[:2])}" for n in ("node-0", "node-1")]

    for node in ("node-0", "node-1"):
        opts = unwrap(cloud.named(f"{node}-docker-engine").inputs["sshOpts"])
        opts = json.loads(opts) if isinstance(opts, str) else opts  # provider inputs arrive JSON-encoded
        joined = " ".join(opts)
        for option in ("IdentitiesOnly=yes", "BatchMode=yes", "StrictHostKeyChecking=yes",
                       "UserKnownHostsFile=~/.ssh/roll-cluster/multi.known_hosts"):
            assert option in joined, joined
        assert "accept-new" not in joined
        gpu_env = unwrap(cloud.named(f"{node}-gpu-ready").inputs["environment"])
        assert gpu_env["KNOWN_HOSTS_FILE"] == "~/.ssh/roll-cluster/multi.known_hosts"
        assert gpu_env["HOST_KEY_CHECKING"] == "yes"

    for output in ("sshHead", "dashboardTunnel", "jobStatus", "jobLogs"):
        assert "-o UserKnownHostsFile=~/.ssh/roll-cluster/multi.known_hosts -o StrictHostKeyChecking=yes" in (
            result.outputs[output]
        ), output
        assert "-o IdentitiesOnly=yes" in result.outputs[output]


def test_the_host_key_is_never_logged_and_its_output_is_a_secret() -> None:
    result = run("dev")
    host_key = result.cloud.named("node-0-host-key")
    assert unwrap(host_key.inputs["logging"]) == "none"
    assert "stdout" in (result.cloud.options["node-0-host-key"].additional_secret_outputs or [])


def test_user_data_over_alibabas_limit_is_refused_by_the_offline_cloud() -> None:
    big = base64.b64encode(b"#!/bin/bash\n" + b"#" * (32 * 1024)).decode()
    with pytest.raises(offline.AlibabaRefused, match="over the 32768-byte limit"):
        offline._refuse_like_alibaba(INSTANCE, "node-0-instance", {"userData": big})


def test_pulumi_command_signs_through_the_agent_when_there_is_no_key_text() -> None:
    # No private key: pulumi-command falls back to the agent at $SSH_AUTH_SOCK (provider connection.go, SSHConfig).
    through_agent = remote_steps.connection("47.1.2.3", None, host_key="ssh-ed25519 AAAA")
    assert through_agent.private_key is None and through_agent.host_key == "ssh-ed25519 AAAA"


@pytest.mark.parametrize("stack", ["multi", "openrlhf", "hosts"])
def test_teardowns_log_in_with_the_same_identity_as_every_other_local_client(
    stack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key held only in ssh-agent: every system ssh gets the .pub file naming it, `pulumi destroy` as `up`.
    agent_pub = f"/home/alice/.ssh/roll-cluster/{stack}.agent-key.pub"
    through_agent = ssh_access.LoginKey(private_key=None, identity_file=agent_pub, via_agent=True)
    monkeypatch.setattr(steps, "stack_login_key", lambda *_: through_agent)
    cloud = run(stack).cloud
    teardowns = [r for r in cloud.of_type(LOCAL) if r.name.endswith("-teardown")]
    assert {"node-0-ray-head-teardown", "training-job-teardown"} <= {r.name for r in teardowns}
    for teardown in teardowns:
        env = unwrap(teardown.inputs["environment"])
        assert env["SSH_KEY_PATH"] == agent_pub, teardown.name
        assert env["TEARDOWN_RESOURCE"] == teardown.name
    gpu_ready = [r for r in cloud.of_type(LOCAL) if r.name.endswith("-gpu-ready")]
    assert gpu_ready and all(unwrap(r.inputs["environment"])["SSH_KEY_PATH"] == agent_pub for r in gpu_ready)


def test_a_stale_ssh_auth_sock_is_refused_even_with_a_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pulumi-command dials $SSH_AUTH_SOCK whenever it is set and fails every remote step on the dial error.
    plain = keygen(tmp_path, "plain")
    public = (tmp_path / "plain.pub").read_text().strip()  # the pair matches: only the socket is wrong
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "gone.sock"))
    with pytest.raises(ConfigError, match="SSH_AUTH_SOCK"):
        ssh_access.login_key(str(plain), public, tmp_path / "a.pub", agent_keys=lambda: None)
    monkeypatch.delenv("SSH_AUTH_SOCK")
    assert ssh_access.login_key(str(plain), public, tmp_path / "a.pub", agent_keys=lambda: None).private_key


def test_an_agent_key_past_sshds_max_auth_tries_is_refused_with_the_fix(tmp_path: Path) -> None:
    locked = keygen(tmp_path, "locked", passphrase="pw")
    public = (tmp_path / "locked.pub").read_text().strip()
    others = [f"ssh-ed25519 AAAAother{i} k{i}" for i in range(6)]
    with pytest.raises(ConfigError, match="MaxAuthTries"):
        ssh_access.login_key(str(locked), public, tmp_path / "a.pub", agent_keys=lambda: [*others, public])
    assert ssh_access.login_key(str(locked), public, tmp_path / "a.pub",
                                agent_keys=lambda: [*others[:5], public]).via_agent


def test_the_system_ssh_skips_the_agent_with_a_key_file_and_uses_it_for_an_agent_key() -> None:
    assert "IdentityAgent=none" in known_hosts.ssh_options("~/.ssh/id_ed25519", "kh", "yes")
    assert "IdentityAgent=none" not in known_hosts.ssh_options("~/.ssh/roll-cluster/dev.agent-key.pub", "kh", "yes")
