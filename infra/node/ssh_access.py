"""How the program's SSH clients authenticate to the nodes and know the nodes' host keys.

Two facts decide what every SSH client of the program (pulumi-command's remote steps, the docker provider, the
local gpu-ready loop, the commands in the stack outputs) is given:

- The login key. `access.sshPrivateKeyPath` is read at plan time. A key without a passphrase is handed to
  pulumi-command as a secret, and to the system `ssh` as `-i <path>`. A key with a passphrase, or a key held only in
  ssh-agent, works only through ssh-agent: nothing here can ask for a passphrase (`BatchMode=yes`, and
  pulumi-command has no prompt). So such a key must be loaded in the agent (`ssh-add`), which is checked here
  with `ssh-add -L` before any resource exists; pulumi-command then signs through the agent (it uses
  $SSH_AUTH_SOCK when no private key is given: pulumi-command provider/pkg/provider/remote/connection.go,
  SSHConfig) and the system ssh as well (`-i` names the key, `IdentitiesOnly=yes` keeps other agent keys out).
- The host keys: see infra/node/known_hosts.py.

A security-key type (`sk-ssh-ed25519@openssh.com`, `sk-ecdsa-...`) is refused: it needs a touch of the token for
every connection and the program opens dozens; pulumi-command's Go client cannot use it either.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.config import PROJECT, ConfigError

PRIVATE_KEY_KEY = f"{PROJECT}:access.sshPrivateKeyPath"
PUBLIC_KEY_KEY = f"{PROJECT}:access.sshPublicKey"
AGENT_LIST_TIMEOUT_S = 10

# ImportKeyPair: "The imported key pair must support one of the following encryption methods: rsa, dsa, ssh-rsa,
# ssh-dss, ecdsa" (help/en/ecs/developer-reference/api-ecs-2014-05-26-importkeypair, Jun 2026); ssh-ed25519 is
# not among them. verified-facts#ssh-access-alibaba-cloud-verified.
IMPORTABLE_KEY_TYPES = ("ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")


@dataclass(frozen=True)
class LoginKey:
    """How the SSH clients prove who they are."""

    private_key: str | None  # the key text for pulumi-command; None: sign through ssh-agent
    identity_file: str  # what the system ssh gets as -i: the private key file, or a .pub file naming the agent key
    via_agent: bool

    @property
    def mechanism(self) -> str:
        return "ssh-agent ($SSH_AUTH_SOCK)" if self.via_agent else f"key file {self.identity_file}"


def importable(public_key: str) -> bool:
    """Whether ECS ImportKeyPair accepts this key type (else the key reaches the nodes only through user data)."""
    return public_key.split(maxsplit=1)[0] in IMPORTABLE_KEY_TYPES


def is_encrypted(key_text: str) -> bool:
    """Whether a private key file needs a passphrase: OpenSSH format with a cipher other than `none`, legacy PEM
    with `Proc-Type: 4,ENCRYPTED`, or PKCS#8 `ENCRYPTED PRIVATE KEY`."""
    if "Proc-Type: 4,ENCRYPTED" in key_text or "BEGIN ENCRYPTED PRIVATE KEY" in key_text:
        return True
    begin, end = "-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"
    if begin not in key_text:
        return False
    body = key_text.split(begin, 1)[1].split(end, 1)[0]
    try:
        blob = base64.b64decode("".join(body.split()), validate=True)
    except binascii.Error:
        return False
    # PROTOCOL.key: "openssh-key-v1\0", then string ciphername ("none" when the key is not encrypted).
    magic = b"openssh-key-v1\x00"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return False
    length = int.from_bytes(blob[len(magic) : len(magic) + 4], "big")
    cipher = blob[len(magic) + 4 : len(magic) + 4 + length]
    return cipher != b"none"


def agent_public_keys() -> list[str] | None:
    """The public keys ssh-agent holds (`ssh-add -L`), or None when no agent answers."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return None
    try:
        listed = subprocess.run(
            ["ssh-add", "-L"], capture_output=True, text=True, timeout=AGENT_LIST_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode == 2:  # "Could not open a connection to your authentication agent."
        return None
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


def _same_key(a: str, b: str) -> bool:
    return a.split()[:2] == b.split()[:2]


def fingerprint(public_key: str) -> str:
    """`SHA256:...` as `ssh-keygen -lf` prints it: the unpadded base64 of the SHA-256 of the key blob."""
    try:
        blob = base64.b64decode(public_key.split()[1], validate=True)
    except (binascii.Error, IndexError):
        return "an unreadable key"
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def derived_public_key(key_file: Path) -> str | None:
    """The public half of an unencrypted private key file (`ssh-keygen -y`), or None when ssh-keygen cannot say."""
    try:
        derived = subprocess.run(
            ["ssh-keygen", "-y", "-P", "", "-f", str(key_file)],
            capture_output=True, text=True, timeout=AGENT_LIST_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = derived.stdout.strip()
    return line if derived.returncode == 0 and len(line.split()) >= 2 else None


def _check_pair(key_file: Path, text: str, public_key: str | None) -> None:
    """The private key file must be a private key, and the one whose public half the nodes get."""
    if text.lstrip().startswith(("ssh-", "ecdsa-", "sk-")):
        raise ConfigError([
            f"{PRIVATE_KEY_KEY}: {key_file} holds a public key; give the private key file (the one without .pub); "
            "nothing was created"
        ])
    if public_key is None:
        return
    derived = derived_public_key(key_file)
    if derived is not None and not _same_key(derived, public_key):
        raise ConfigError([
            f"{PUBLIC_KEY_KEY}: must be the public half of the private key {key_file} (access.sshPrivateKeyPath) "
            f"that the program logs in with: the nodes would get {fingerprint(public_key)}, but that file is "
            f"{fingerprint(derived)}; set it with `pulumi config set --path '{PUBLIC_KEY_KEY}' \"$(ssh-keygen -y -f "
            f"{key_file})\"`, or point sshPrivateKeyPath at the matching key; nothing was created"
        ])


SSHD_MAX_AUTH_TRIES = 6  # sshd_config(5) MaxAuthTries default
AGENT_PROBE_TIMEOUT_S = 2.0


def agent_socket_answers(path: str) -> bool:
    """Whether something accepts a connection on the ssh-agent socket at `path`."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(AGENT_PROBE_TIMEOUT_S)
            sock.connect(path)
    except OSError:
        return False
    return True


def _refuse_stale_agent_socket() -> None:
    """pulumi-command dials $SSH_AUTH_SOCK whenever it is set, even with a private key, and fails the step on the
    dial error (remote/connection.go, connection_unix.go): a stale socket fails every remote step.
    See verified-facts#ssh-access-connection-2."""
    sock = os.environ.get("SSH_AUTH_SOCK")
    if sock and not agent_socket_answers(sock):
        raise ConfigError([
            f"SSH_AUTH_SOCK points to {sock}, where no ssh-agent answers; the remote steps (pulumi-command) dial it "
            "even with a key file and would all fail: `unset SSH_AUTH_SOCK` or start the agent again, then run "
            "again; nothing was created"
        ])


def login_key(
    private_key_path: str,
    public_key: str | None,
    agent_pub_file: Path,
    *,
    agent_keys: Callable[[], list[str] | None] = agent_public_keys,
) -> LoginKey:
    """Decide how the SSH clients log in, or raise ConfigError (before any resource) naming the key and the fix.

    agent_pub_file: where the public key is written when the key lives only in the agent (`-i` then names it).
    """
    key_file = Path(private_key_path).expanduser()
    text = key_file.read_text() if key_file.is_file() else None
    if text is not None and not is_encrypted(text):
        _check_pair(key_file, text, public_key)
        _refuse_stale_agent_socket()
        return LoginKey(private_key=text, identity_file=private_key_path, via_agent=False)
    if public_key is None:
        # Your own hosts (nodes.source hosts) name no public key in the config: the one beside the private key.
        pub_file = key_file.with_name(key_file.name + ".pub")
        public_key = pub_file.read_text().strip() if pub_file.is_file() else None
    held = agent_keys()
    in_agent = held is not None and public_key is not None and any(_same_key(k, public_key) for k in held)
    if in_agent and public_key is not None:
        # The system ssh gets the public key as -i: with IdentitiesOnly=yes it then offers exactly this agent key,
        # without reading (and asking the passphrase of) the private key file.
        position = next(i for i, k in enumerate(held or []) if _same_key(k, public_key))
        if position >= SSHD_MAX_AUTH_TRIES:
            # pulumi-command offers every agent key in the agent's order (remote/connection.go), and sshd
            # counts each refused one: past MaxAuthTries (default 6, sshd_config(5)) it disconnects first.
            # see verified-facts#ssh-access-connection
            raise ConfigError([
                f"{PRIVATE_KEY_KEY}: the login key is key {position + 1} of {len(held or [])} in ssh-agent; the SSH "
                f"steps offer the agent's keys in order and sshd's MaxAuthTries (default {SSHD_MAX_AUTH_TRIES}) "
                "disconnects before this one. Run with an agent holding only this key (`eval \"$(ssh-agent)\" && "
                f"ssh-add {private_key_path}`), or give a key file without a passphrase; nothing was created"
            ])
        agent_pub_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        agent_pub_file.write_text(public_key.strip() + "\n")
        return LoginKey(private_key=None, identity_file=str(agent_pub_file), via_agent=True)
    agent_state = (
        "no ssh-agent answers ($SSH_AUTH_SOCK is unset or stale)"
        if held is None
        else f"ssh-agent holds {len(held)} key(s), not this one"
    )
    if text is not None:
        raise ConfigError([
            f"{PRIVATE_KEY_KEY}: {key_file} is protected by a passphrase, and the program cannot ask for it (every "
            f"SSH step runs unattended); {agent_state}. Load it into the agent first (`ssh-add {private_key_path}`) "
            "and run again in the same shell, or use a key without a passphrase; nothing was created"
        ])
    raise ConfigError([
        f"{PRIVATE_KEY_KEY}: no private key at {key_file}, and {agent_state}. Give the path of the private key that "
        f"matches {PUBLIC_KEY_KEY}, or load that key into ssh-agent (`ssh-add`) and run again in the same shell; "
        "nothing was created"
    ])
