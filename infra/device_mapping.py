"""ROLL's `device_mapping` strings, read without eval.

ROLL runs the string through Python's eval(); the forms its examples use are `list(range(a,b[,step]))`,
a literal list `[0, 1, 2]`, and sums of those (`list(range(0,4)) + [6, 7]`). Anything else is rejected
here rather than evaluated.
"""

from __future__ import annotations

import re
from typing import Any

_RANGE = re.compile(r"list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?\)\s*\)")
_LIST = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*,?\s*\]")


class DeviceMappingError(ValueError):
    pass


def parse_device_mapping(value: Any) -> list[int]:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if not isinstance(value, str):
        raise DeviceMappingError("must be `list(range(a,b))`, a list of GPU indices, or a sum of those")
    indices: list[int] = []
    for term in value.split("+"):
        term = term.strip()
        if match := _RANGE.fullmatch(term):
            a, b, step = match.groups()
            start, stop = (0, int(a)) if b is None else (int(a), int(b))
            indices += list(range(start, stop, int(step) if step else 1))
        elif match := _LIST.fullmatch(term):
            indices += [int(x) for x in (match.group(1) or "").replace(" ", "").split(",") if x]
        else:
            raise DeviceMappingError("must be `list(range(a,b))`, a list of GPU indices, or a sum of those")
    return indices
