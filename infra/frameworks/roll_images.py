"""Which megatron-core each ROLL image ships, against the pin of ROLL's own mcore_adapter, which every ROLL
requirements file installs (`./mcore_adapter` in requirements_common.txt at ROLL 8eb27cc).

Facts read at ROLL 8eb27cc (docs/verified-facts.md, "megatron-core in ROLL's images"):
- mcore_adapter/pyproject.toml requires megatron-core >=0.15.0,<0.19.0.
- docker/Dockerfile.torch260.vllm and Dockerfile.torch260.sglang install megatron-core==0.11.0;
  Dockerfile.torch280 >=0.13.0,<0.14.0; Dockerfile.torch2100 Megatron-LM's core_dev_r0.16.0 from git
  (ROLL's published tag nvcr-25.11-py3-torch2100-mcore0160dev-vllm016dev, docs_roll/.../image_address.md).
- So no published ROLL image that runs on GPUs without bf16 (only torch260 does: RollAdapter.image_problem)
  meets the pin: the code step's `pip install -r requirements_*.txt` replaces the image's megatron-core with the
  newest release in range. On the package index that is 0.16.1 (checked 2026-11-28): a prebuilt wheel for the
  image's Python 3.10 (cp310, manylinux_2_28; the image is Ubuntu 22.04), requiring torch>=2.6.0, so nothing is
  compiled and torch 2.6.0 stays. A baked image (nodes.bake) keeps the result. Whether megatron-core 0.16 runs with
  the image's Transformer Engine 2.2 is UNCONFIRMED (its own `dev` extra names TE >=2.9).
See verified-facts#roll-images-pyproject.
"""

from __future__ import annotations

import re

MCORE_ADAPTER_PIN = (">=0.15.0,<0.19.0", "mcore_adapter/pyproject.toml:11")
_LOWEST, _BELOW = (0, 15, 0), (0, 19, 0)
# What pip takes for the pin from the index when the image's is outside it (checked 2026-11-28).
INDEX_MEGATRON_CORE = "0.16.1"

# (tag pattern, the image's megatron-core, where the Dockerfile says so), ROLL 8eb27cc.
IMAGE_MEGATRON_CORE: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"torch260-vllm"), "0.11.0", "docker/Dockerfile.torch260.vllm:21"),
    (re.compile(r"torch260-sglang"), "0.11.0", "docker/Dockerfile.torch260.sglang:21"),
    (re.compile(r"torch280"), "0.13", "docker/Dockerfile.torch280:22 (>=0.13.0,<0.14.0)"),
    (re.compile(r"torch2100-mcore0160"), "0.16.0", "docker/Dockerfile.torch2100:21 (core_dev_r0.16.0)"),
)


def _image_version(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def image_megatron_core(tag: str) -> tuple[str, str] | None:
    """(version, source) of the megatron-core the ROLL image with this tag ships; None for a tag of no known image."""
    return next(((version, source) for pattern, version, source in IMAGE_MEGATRON_CORE if pattern.search(tag)), None)


def meets_mcore_adapter(version: str) -> bool:
    return _LOWEST <= _image_version(version) < _BELOW


def megatron_core_note(tag: str) -> str:
    """What the plan says about megatron-core for a ROLL image tag."""
    shipped = image_megatron_core(tag)
    pin, pin_source = MCORE_ADAPTER_PIN
    if shipped is None:
        return f"the image's megatron-core is not known here; ROLL's mcore_adapter needs {pin} ({pin_source})"
    version, source = shipped
    if meets_mcore_adapter(version):
        return f"the image's {version} ({source}) meets mcore_adapter's {pin} ({pin_source}): kept"
    return (
        f"the image ships {version} ({source}), mcore_adapter needs {pin} ({pin_source}): the code step installs "
        f"the newest in range from the pip index ({INDEX_MEGATRON_CORE} on 2026-11-28: a prebuilt cp310 wheel, "
        "torch>=2.6.0, nothing compiled); nodes.bake keeps it in the image. megatron-core 0.16 over the image's "
        "Transformer Engine 2.2: UNCONFIRMED"
    )
