"""`roll-cluster:nodes.hosts` and `nodes.hostDefaults`: your own machines, one entry each (nodes.source hosts)."""

from __future__ import annotations

import ipaddress
import re

from pydantic import Field, ValidationInfo, field_validator

from infra.config.base import Section, _is_ip, _problem, _shown
from infra.config.values import SSH_USER, canonical_host

_SSH_USER = SSH_USER
_INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}")
# Interfaces that exist on one host only: Docker's and libvirt's bridges, container veth pairs, CNI bridges.
_HOST_LOCAL_INTERFACE = re.compile(r"docker[0-9]*|br-[0-9a-f]+|veth[A-Za-z0-9]*|virbr[0-9]+(-nic)?|cni[0-9]+|"
                                   r"podman[0-9]+|lxcbr[0-9]+|lxdbr[0-9]+")


def _check_interface(name: str | None) -> str | None:
    if name is not None and not _INTERFACE.fullmatch(name):
        raise _problem(f"must be a network interface name such as `eth0` or `bond0`; got {_shown(name)}")
    if name is not None and re.fullmatch(r"lo[0-9]*(:.*)?", name):
        raise _problem("must be the NIC of the private address, not the loopback interface (NCCL over `lo` never "
                       f"reaches another host); got {_shown(name)}")
    if name is not None and _HOST_LOCAL_INTERFACE.fullmatch(name):
        raise _problem("must be the NIC of the private address, not a bridge or virtual interface of this host "
                       "(`docker0`, `br-...`, `veth...`, `virbr0` reach no other host, so NCCL would hang); got "
                       + _shown(name))
    return name




class HostDefaults(Section):
    user: str = Field(
        "root", pattern=f"^{_SSH_USER.pattern}$",
        description="SSH user; a user other than root needs passwordless sudo (`sudo -n`).",
    )
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    network_interface: str | None = Field(
        None,
        description="The NIC of the private address (e.g. `bond0`): NCCL, Gloo and HCCL bind to it in the "
        "container. Left out: NCCL avoids `docker0` and `lo` by itself (`NCCL_SOCKET_IFNAME=^docker,lo`).",
    )

    @field_validator("network_interface")
    @classmethod
    def _interface(cls, name: str | None) -> str | None:
        return _check_interface(name)


class HostConfig(Section):
    address: str = Field(
        description="How the machine running `pulumi up` reaches the host over SSH: an IP address or a DNS name."
    )
    private_address: str | None = Field(
        None,
        description="The IP address the other hosts reach this one at (Ray, NCCL/HCCL). Left out: `address`, "
        "which must then be an IP address.",
    )
    user: str | None = Field(
        None, pattern=f"^{_SSH_USER.pattern}$", description="SSH user of this host; default `hostDefaults.user`."
    )
    port: int | None = Field(None, ge=1, le=65535, description="SSH port of this host; default `hostDefaults.port`.")
    network_interface: str | None = Field(
        None, description="NIC of this host's private address; default `hostDefaults.networkInterface`."
    )

    @field_validator("network_interface")
    @classmethod
    def _interface(cls, name: str | None) -> str | None:
        return _check_interface(name)

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        # Canonical (IP in its usual form, DNS names lower-cased): two spellings of one host compare equal.
        address = canonical_host(address)
        if _is_ip(address):
            ip = ipaddress.ip_address(address)
            if ip.is_unspecified or ip.is_multicast or ip.is_reserved or address == "255.255.255.255":
                raise _problem("must be the address of one host that SSH reaches (not unspecified like 0.0.0.0, "
                               f"multicast, broadcast or reserved); got {_shown(address)}")
        return address

    @field_validator("private_address")
    @classmethod
    def _private(cls, address: str | None, info: ValidationInfo) -> str | None:
        if address is None:
            public = info.data.get("address")
            if public is not None and not _is_ip(public):
                raise _problem(
                    "required when address is a DNS name: Ray binds and advertises an IP address (the one the other "
                    f"hosts reach this one at); got nothing with address {_shown(public)}",
                    "..", "privateAddress",  # a default's error is reported under the field's name, not its key
                )
            return address
        if not _is_ip(address):
            raise _problem(f"must be an IP address such as `10.0.0.11`; got {_shown(address)}")
        address = canonical_host(address)
        ip = ipaddress.ip_address(address)
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved:
            raise _problem("must be an address the other hosts can reach (not loopback, link-local, unspecified, "
                           f"multicast or reserved); got {_shown(address)}")
        return address

    @property
    def private_ip(self) -> str:
        return self.private_address or self.address
