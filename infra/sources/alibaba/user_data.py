"""The first-boot user data of an ECS instance: first_boot.sh with its parameters, compressed inside a plain-text
bash script that unpacks and runs it (and the reverse, for the tests)."""

from __future__ import annotations

import base64
import gzip

from infra.config import NodesConfig
from infra.node import remote

# Before Base64 encoding, user data "can only be up to 32 KB in size" (help/en/ecs/user-guide/overview-of-ecs-
# instance-user-data, Jun 2024; older pages say 16 KB): verified-facts#user-data-user-data; the
# RunInstances API's UserData says the same ("需要以Base64方式编码，原始数据最多为32 KB", "Base64-encoded, raw data
# at most 32 KB"), so the limit counts the bytes sent before Base64: here the gzip bytes (docs/verified-facts.md 1).
# The first-boot script (lib.sh included) is about 35 KB, so it travels compressed: gzip (about 12 KB), then Base64,
# inside a short plain-text bash script that unpacks and runs it (about 17 KB in all). Plain text rather than the
# raw gzip bytes Alibaba also lists as a user-data format ("Gzip-compressed script", help/doc-detail/49121.htm) and
# cloud-init would unpack (cloudinit/user_data.py): no source says the metadata service hands binary user data
# back unchanged (docs/verified-facts.md 1), while a `#!` script is the format every path takes as it is.
USER_DATA_LIMIT_BYTES = 32 * 1024


def first_boot_user_data(
    nodes: NodesConfig,
    *,
    ssh_public_key: str = "",
    host_key_private: str = "",
    host_key_public: str = "",
    fabric_manager: bool = False,
) -> str:
    """cloud-init user data: first_boot.sh with its parameters, as a bash script."""
    env = {
        "GPU_DRIVER": nodes.gpu_driver,
        "DRIVER_VERSION": nodes.driver_version,
        "CUDA_VERSION": nodes.cuda_version,
        "CUDNN_VERSION": nodes.cudnn_version,
        "FABRIC_MANAGER": "true" if fabric_manager else "false",
        "ROOT_AUTHORIZED_KEY": ssh_public_key,
        "SSH_HOST_KEY_ED25519": host_key_private,
        "SSH_HOST_KEY_ED25519_PUB": host_key_public,
    }
    return remote.render_user_data("first_boot.sh", env)


FIRST_BOOT_MARKER = "ROLL_CLUSTER_FIRST_BOOT"
# The user data cloud-init runs: unpack the first-boot script (no file: it holds the node's host key) and run it.
UNPACK_AND_RUN = f"""#!/bin/bash
# roll-cluster first boot: the script below is gzip-compressed and Base64-encoded (ECS user data is at most 32 KB).
set -euo pipefail
first_boot=$(base64 -d <<'{FIRST_BOOT_MARKER}' | gunzip
{{payload}}
{FIRST_BOOT_MARKER}
)
exec bash -c "$first_boot" first-boot
"""


def encode_user_data(script: str) -> str:
    """The instance's `user_data`: a plain-text script that unpacks `script` (gzip with mtime 0, so the same script
    gives the same bytes and no spurious diff; then Base64) and runs it; Base64-encoded as the API wants it.
    Refused when over Alibaba's limit."""
    payload = base64.encodebytes(gzip.compress(script.encode(), mtime=0)).decode().rstrip("\n")
    text = UNPACK_AND_RUN.replace("{payload}", payload).encode()
    if len(text) > USER_DATA_LIMIT_BYTES:
        raise ValueError(
            f"the first-boot user data is {len(text)} bytes, over Alibaba's limit of {USER_DATA_LIMIT_BYTES} "
            "bytes before Base64"
        )
    return base64.b64encode(text).decode()


def decode_user_data(user_data: str) -> str:
    """The first-boot script inside an instance's `user_data` (what the unpacking script runs)."""
    text = base64.b64decode(user_data).decode()
    payload = text.split(f"<<'{FIRST_BOOT_MARKER}' | gunzip\n", 1)[1].split(f"\n{FIRST_BOOT_MARKER}\n", 1)[0]
    return gzip.decompress(base64.b64decode(payload)).decode()
