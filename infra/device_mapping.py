"""ROLL's `device_mapping` strings, read without eval.

ROLL runs the string through Python's eval(); the forms its examples use are `list(range(a,b[,step]))`,
a literal list `[0, 1, 2]`, the same list wrapped in `list(...)` (`list([0,1,2,3,8,9,10,11])`,
examples/qwen2.5-7B-rlvr_megatron/rlvr_qwen2.5_7B_seperate.yaml at ROLL 8eb27cc), and sums of those
(`list(range(0,4)) + [6, 7]`). Anything else is rejected
here rather than evaluated. A YAML list of integers is accepted as well.
"""

from __future__ import annotations

import re
from typing import Any

_RANGE = re.compile(r"list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?\)\s*\)")
# `[]`, `[0]`, `[0, 1]`, `[0, 1,]`; not `[,]`, which Python rejects too.
_LIST = re.compile(r"\[\s*(?:(\d+(?:\s*,\s*\d+)*)\s*,?\s*)?\]")
_LIST_OF_LIST = re.compile(r"list\(\s*(" + _LIST.pattern + r")\s*\)")
FORMS = "`list(range(a,b))`, a list of GPU indices such as `[0, 1]` (or `list([0, 1])`), or a sum of those"


class DeviceMappingError(ValueError):
    pass


def parse_device_mapping(value: Any) -> list[int]:
    """The global GPU indices a device_mapping value names, in order (duplicates kept)."""
    if isinstance(value, list):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise DeviceMappingError(f"must be {FORMS}; a list may hold only whole numbers")
        if any(v < 0 for v in value):
            raise DeviceMappingError("GPU indices must not be negative")
        return list(value)
    if not isinstance(value, str):
        raise DeviceMappingError(f"must be {FORMS}")
    indices: list[int] = []
    for term in value.split("+"):
        term = term.strip()
        if match := _RANGE.fullmatch(term):
            a, b, step = match.groups()
            start, stop = (0, int(a)) if b is None else (int(a), int(b))
            if step is not None and int(step) == 0:
                # range() raises on a zero step; ROLL would fail at start-up, so say it here.
                raise DeviceMappingError(f"the step of `{term}` must not be 0")
            indices += list(range(start, stop, int(step) if step else 1))
        elif match := _LIST.fullmatch(term):
            indices += [int(x) for x in re.findall(r"\d+", match.group(1) or "")]
        elif match := _LIST_OF_LIST.fullmatch(term):
            indices += [int(x) for x in re.findall(r"\d+", match.group(1))]
        else:
            raise DeviceMappingError(f"must be {FORMS}; `{term}` is none of those")
    return indices
