"""What a real Alibaba Cloud API call answers with an error for, beyond the provider's schema: the offline cloud
refuses the same inputs (ImportKeyPair's key types, the user-data size limit, an ESSD data disk smaller than its
performance level's minimum)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from devtools.alibaba_shapes import ESSD_MIN_GIB, IMPORT_KEY_PAIR_TYPES, USER_DATA_LIMIT_BYTES
from devtools.mock_secrets import reveal


class AlibabaRefused(RuntimeError):
    """What a real Alibaba Cloud API call would answer with an error for."""


def _refuse_like_alibaba(typ: str, name: str, inputs: Mapping[str, Any]) -> None:
    if typ == "alicloud:ecs/ecsKeyPair:EcsKeyPair":
        key = reveal(inputs.get("publicKey"))  # unknown in a first preview: nothing to check yet
        key_type = (key if isinstance(key, str) else "").split(maxsplit=1)[:1]
        if key_type and key_type[0] not in IMPORT_KEY_PAIR_TYPES:
            raise AlibabaRefused(
                f"{name}: ImportKeyPair refuses a {key_type[0]} key (it accepts rsa, dsa and ecdsa)"
            )
    if typ == "alicloud:ecs/instance:Instance":
        user_data = reveal(inputs.get("userData"))
        if user_data and isinstance(user_data, str):
            size = len(base64.b64decode(str(user_data)))  # gzip-compressed or not: the bytes before Base64
            if size > USER_DATA_LIMIT_BYTES:
                raise AlibabaRefused(
                    f"{name}: user data of {size} bytes (before Base64) is over the {USER_DATA_LIMIT_BYTES}-byte limit"
                )
        for disk in inputs.get("dataDisks") or []:
            # The provider sends PerformanceLevel for cloud_essd only (TF resource_alicloud_instance.go:1034).
            level = disk.get("performanceLevel") if disk.get("category") == "cloud_essd" else None
            size = disk.get("size")
            if isinstance(level, str) and isinstance(size, (int, float)) and size < ESSD_MIN_GIB.get(level, 0):
                raise AlibabaRefused(
                    f"{name}: InvalidDataDiskSize.ValueNotSupported: a {level} ESSD data disk needs at least "
                    f"{ESSD_MIN_GIB[level]} GiB; got {size:g}"
                )
