"""`roll-cluster:access`: who may reach the nodes (admin CIDRs, the dashboard) and with which SSH key."""

from __future__ import annotations

import base64
import binascii
import contextlib
import ipaddress
import os
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from infra.config.base import KeyPath, Section, _problem, _Problems, _shown

WORLD_CIDRS = ("0.0.0.0/0", "::/0")
SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
SECURITY_KEY_TYPES = ("sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


def covers_the_world(cidrs: list[str]) -> bool:
    """Whether the CIDRs together cover every IPv4 or every IPv6 address (`0.0.0.0/1` + `128.0.0.0/1` does)."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for cidr in cidrs:
        with contextlib.suppress(ValueError):
            network = ipaddress.ip_network(cidr, strict=False)
            if isinstance(network, ipaddress.IPv4Network):
                v4.append(network)
            else:
                v6.append(network)
    return (ipaddress.IPv4Network("0.0.0.0/0") in ipaddress.collapse_addresses(v4)
            or ipaddress.IPv6Network("::/0") in ipaddress.collapse_addresses(v6))


# Address space that is not public internet (RFC 6890 special-purpose and RFC 1918 private blocks, multicast and
# reserved): what adminCidrs admits of it does not count as exposure.
NON_PUBLIC_V4 = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24",
    "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "224.0.0.0/4", "240.0.0.0/4",
))
# Public addresses SSH may face without allowWorld (a /16), and the dashboard may ever face (a /22).
SSH_PUBLIC_LIMIT = 2**16
DASHBOARD_PUBLIC_LIMIT = 2**10


def public_addresses(cidrs: list[str]) -> int:
    """How many public IPv4 addresses the CIDRs admit together, whatever the spelling (overlaps counted once)."""
    networks: list[ipaddress.IPv4Network] = []
    for cidr in cidrs:
        with contextlib.suppress(ValueError):
            network = ipaddress.ip_network(cidr, strict=False)
            if isinstance(network, ipaddress.IPv4Network):
                networks.append(network)
    intervals = [(int(n.network_address), int(n.broadcast_address) + 1) for n in ipaddress.collapse_addresses(networks)]
    holes = sorted((int(n.network_address), int(n.broadcast_address) + 1) for n in NON_PUBLIC_V4)
    total = 0
    for start, end in intervals:
        total += end - start
        for hole_start, hole_end in holes:
            total -= max(0, min(end, hole_end) - max(start, hole_start))
    return total


class AccessConfig(Section):
    admin_cidrs: list[str] = Field(
        default_factory=list,
        description="IPv4 CIDRs without host bits (e.g. `203.0.113.0/24`), each listed once: the only sources that "
        "may reach SSH and (in `admin-cidrs` mode) the dashboard. IPv6 CIDRs are refused: the cluster's VPC has no "
        "IPv6, so such a rule would never match. Required with nodes.source `alibaba` (the security group's rules); "
        "refused with `hosts`, whose firewalls are yours.",
    )
    allow_world: bool = Field(
        False,
        description="Must be true when `adminCidrs` together admit more than 65,536 public addresses (a /16; "
        "private and reserved ranges do not count), e.g. `0.0.0.0/0` or CIDRs whose union covers much of the "
        "internet. It opens SSH only: the dashboard never faces more than 1,024 public addresses.",
    )
    ssh_public_key: str | None = Field(
        None,
        description="OpenSSH public key line (`ssh-ed25519 AAAA... comment`; ed25519, RSA or ECDSA, not a security "
        "key), installed for root on every node through the first-boot user data (ECS key pairs cannot hold "
        "ed25519; RSA and ECDSA keys also get one). Never a private key. Required with nodes.source `alibaba`; "
        "refused with `hosts` (the key must already be in each host's authorized_keys; nothing is installed there).",
    )
    ssh_private_key_path: str = Field(
        "~/.ssh/id_ed25519",
        description="The matching private key on the machine that runs `pulumi up`; used for the SSH steps. A key "
        "with a passphrase, or one only in ssh-agent, must be loaded in the agent (`ssh-add`): the steps run "
        "unattended and cannot ask for a passphrase.",
    )
    dashboard: Literal["admin-cidrs", "tunnel"] = Field(
        "tunnel",
        description="`tunnel` (the default): the dashboard and Jobs API listen on the head's 127.0.0.1 only; reach "
        "them through SSH with the `dashboardTunnel` output. `admin-cidrs` (opt-in): they listen on the head's "
        "address, reachable from `adminCidrs`. Ray's dashboard has no authentication: whoever reaches it can run "
        "code on your cluster and read its secrets (the W&B and Hugging Face tokens in the raylet's environment). "
        "Refused when `adminCidrs` admit more than 1,024 public addresses (a /22), even with `allowWorld`. With "
        "nodes.source `hosts` "
        "only `tunnel`: no rule of ours guards your hosts.",
    )

    @field_validator("admin_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        problems: list[tuple[KeyPath, str]] = []
        for index, cidr in enumerate(cidrs):
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as error:
                hint = ""
                with contextlib.suppress(ValueError):  # not an address at all: there is nothing to suggest
                    hint = f"; did you mean {ipaddress.ip_network(cidr, strict=False)}?"
                problems.append(
                    ((index,), f"must be a CIDR such as 203.0.113.0/24 ({error}{hint}); got {_shown(cidr)}")
                )
        seen: dict[str, int] = {}
        for index, cidr in enumerate(cidrs):
            if any(index == p[0][0] for p in problems):
                continue
            network = ipaddress.ip_network(cidr)
            if network.version == 6:
                problems.append(((index,), "must be an IPv4 CIDR: the cluster's VPC has no IPv6 (its nodes have IPv4 "
                                 f"addresses only), so an IPv6 rule would never match; got {_shown(cidr)}"))
            elif str(network) in seen:
                problems.append(((index,), f"repeats adminCidrs[{seen[str(network)]}]: list each CIDR once; got "
                                 f"{_shown(cidr)} twice"))
            else:
                seen[str(network)] = index
        if problems:
            raise _Problems(*problems)
        return [str(ipaddress.ip_network(cidr)) for cidr in cidrs]  # canonical: /0.0.0.255 and /255.255.255.0 -> /24

    @field_validator("dashboard")
    @classmethod
    def _dashboard_never_to_the_world(cls, dashboard: str, info: ValidationInfo) -> str:
        # adminCidrs is declared before dashboard, so info.data holds it when it is valid.
        cidrs = info.data.get("admin_cidrs", [])
        public = public_addresses(cidrs)
        if dashboard == "admin-cidrs" and public > DASHBOARD_PUBLIC_LIMIT:
            raise _problem(
                f"admin-cidrs would open the Ray dashboard to {public:,} public addresses"
                f"{' (the whole internet)' if covers_the_world(cidrs) else ''} (adminCidrs "
                f"{_shown(cidrs)}; at most {DASHBOARD_PUBLIC_LIMIT:,}, a /22): whoever reaches the dashboard can run "
                "code on your cluster and read its secrets. Refused even "
                "with allowWorld; use `tunnel` (the default) or list your own address ranges in adminCidrs; got "
                '"admin-cidrs"'
            )
        return dashboard

    @field_validator("allow_world")
    @classmethod
    def _world_needs_opt_in(cls, allow_world: bool, info: ValidationInfo) -> bool:
        # adminCidrs is declared before allowWorld, so info.data holds it when it is valid.
        cidrs = info.data.get("admin_cidrs", [])
        public = public_addresses(cidrs)
        if public > SSH_PUBLIC_LIMIT and not allow_world:
            wide = [c for c in cidrs if public_addresses([c]) > SSH_PUBLIC_LIMIT] or cidrs
            raise _problem(
                f"admits {public:,} public addresses to SSH (more than {SSH_PUBLIC_LIMIT:,}, a /16: "
                f"{'the whole internet' if covers_the_world(cidrs) else 'much of the internet'}); allowed only with "
                "allowWorld: true (better: use your own address range, e.g. your public IP/32; the dashboard is never "
                f"opened that wide); got {_shown(wide)} without allowWorld",
                "..", "adminCidrs",
            )
        return allow_world

    @field_validator("ssh_private_key_path")
    @classmethod
    def _key_path(cls, path: str) -> str:
        # It becomes `ssh -i <path>` in the outputs and the steps: never an option, never a second line.
        if path.startswith("-") or any(ord(c) < 32 or ord(c) == 127 for c in path) or not path.strip():
            raise _problem(f"must be the path of a private key file, such as `~/.ssh/id_ed25519` (not starting "
                           f"with `-`, no control characters); got {_shown(path)}")
        normal = os.path.normpath(os.path.abspath(os.path.expanduser(path)))
        kernel = next((root for root in ("/proc", "/sys", "/dev") if normal == root or normal.startswith(root + "/")),
                      None)
        if kernel is not None:
            # /proc/self/environ, /dev/stdin and friends are no key files: reading them hands the steps this
            # machine's environment or blocks on a terminal.
            raise _problem(f"must be the path of a private key file, such as `~/.ssh/id_ed25519`, not a file of the "
                           f"kernel's {kernel}; got {_shown(path)}")
        return path

    @field_validator("ssh_public_key")
    @classmethod
    def _public_key(cls, key: str | None) -> str | None:
        if key is None:
            return None
        key = key.strip()
        if "PRIVATE KEY" in key:
            # The value is not echoed: it is a secret that must not reach the console or CI logs.
            raise _problem(
                "must be a public key (the contents of the .pub file); got a private key. Never put a private "
                "key in the stack config; give its location in access.sshPrivateKeyPath instead"
            )
        parts = key.split(maxsplit=2)
        shown = _shown(key if len(key) <= 40 else key[:40] + "...")
        if len(parts) >= 2 and parts[0] in SECURITY_KEY_TYPES:
            raise _problem(
                f"must not be a security-key type ({parts[0]}): it needs a touch of the token for every SSH "
                "connection, and a deployment opens dozens unattended (pulumi-command cannot use it either). Use "
                "an ed25519 key (`ssh-keygen -t ed25519`; a passphrase is fine with ssh-agent)"
            )
        if "\n" in key or len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
            raise _problem(
                "must be one OpenSSH public key line `<type> <base64 key data> [comment]` (the contents of the "
                f".pub file) with type one of {', '.join(SSH_KEY_TYPES)}; got {shown}"
            )
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except binascii.Error:
            raise _problem(f"must be an OpenSSH public key, but its key data is not base64; got {shown}") from None
        named = _ssh_blob_type(blob)
        if named != parts[0]:
            raise _problem(
                f"must be a valid {parts[0]} key, but its key data is "
                f"{'for ' + named if named else 'not an SSH key'}; got {shown}"
            )
        return key


def _ssh_blob_type(blob: bytes) -> str | None:
    """The key type an OpenSSH key blob starts with (a length-prefixed string), or None if it has none."""
    if len(blob) < 4:
        return None
    length = int.from_bytes(blob[:4], "big")
    name = blob[4 : 4 + length]
    if not 0 < length <= 64 or len(name) != length:
        return None
    return name.decode("ascii", errors="replace")
