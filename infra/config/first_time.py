"""The costly first-time mistakes: the shipped placeholder SSH key, documentation addresses and a placeholder image
left in a stack.

The shipped stacks carry a placeholder key and documentation ranges (RFC 5737, RFC 3849, RFC 9637, `example.com`)
so that the offline plan runs as written. A real `pulumi preview`/`up` with them would build a cluster nobody can
reach (the key is nobody's; the documentation ranges are nobody's addresses), so stack_config.load() refuses them
there, with the commands to set yours; the offline plan prints them as warnings.
"""

from __future__ import annotations

import ipaddress
import re

from infra.config.base import PROJECT
from infra.config.cluster import ClusterConfig

# The key data of the placeholder key in the shipped Pulumi.<stack>.yaml files (matched by its blob, not comment).
PLACEHOLDER_KEY_BLOB = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24",  # RFC 5737
    "2001:db8::/32",  # RFC 3849
    "3fff::/20",  # RFC 9637
))
_DOCUMENTATION_NAME = re.compile(r"(.+\.)?(example\.(com|net|org)|[^.]+\.example)")


def _documentation_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return _DOCUMENTATION_NAME.fullmatch(address.lower()) is not None
    return any(ip.version == n.version and ip in n for n in DOCUMENTATION_NETWORKS)


def _documentation_cidr(cidr: str) -> bool:
    """Whether the CIDR lies wholly in a documentation range (nobody's addresses). A wider range that merely contains
    one, such as `0.0.0.0/0` with allowWorld or an ISP's block, admits real addresses too."""
    network = ipaddress.ip_network(cidr, strict=False)
    return any(network.version == n.version and network.subnet_of(n)  # type: ignore[arg-type]
               for n in DOCUMENTATION_NETWORKS)


def _set_command(key: str, value: str) -> str:
    return f"pulumi config set --path '{PROJECT}:{key}' {value}"


def first_time_mistakes(config: ClusterConfig) -> list[str]:
    """The placeholder key and documentation addresses in a parsed config, one line each with the fixing command."""
    lines: list[str] = []
    key = config.access.ssh_public_key
    if key is not None and PLACEHOLDER_KEY_BLOB in key.split():
        lines.append(
            f"{PROJECT}:access.sshPublicKey: is the placeholder key shipped with the example stacks (nobody has its "
            "private key, so no step could log in); set yours: "
            + _set_command("access.sshPublicKey", '"$(cat ~/.ssh/id_ed25519.pub)"')
        )
    for index, cidr in enumerate(config.access.admin_cidrs):
        if _documentation_cidr(cidr):
            lines.append(
                f"{PROJECT}:access.adminCidrs[{index}]: {cidr} is a documentation range (RFC 5737), nobody's "
                "address: SSH would be open to no one. Set your public address: "
                + _set_command(f"access.adminCidrs[{index}]", '"$(curl -4 -s https://ifconfig.me)/32"')
            )
    for index, host in enumerate(config.nodes.hosts or []):
        for field, value in (("address", host.address), ("privateAddress", host.private_address)):
            if value is not None and _documentation_address(value):
                lines.append(
                    f"{PROJECT}:nodes.hosts[{index}].{field}: {value} is a documentation address, not a host of "
                    f"yours; set it: {_set_command(f'nodes.hosts[{index}].{field}', '<address of your host>')}"
                )
    registry = config.container.registry_host
    if _documentation_address(registry):
        # The Ascend stack ships the name of an image you build (docs/ascend.md, "The image"): no public image has
        # MindSpeed-RL's runtime, so its registry is a documentation domain until you push yours.
        lines.append(
            f"{PROJECT}:container.image: {config.container.image} is pulled from {registry}, a documentation "
            "domain (RFC 2606), not a registry of yours: push the image (docs/ascend.md, \"The image\", for "
            "MindSpeed-RL) and set it: " + _set_command("container.image", "<your registry>/<repository>:<tag>")
        )
    server = config.storage.nfs_server
    if server is not None and _documentation_address(server):
        lines.append(
            f"{PROJECT}:storage.nfsServer: {server} is a documentation address, not your NFS server; set it: "
            + _set_command("storage.nfsServer", "<your NFS server>")
        )
    return lines
