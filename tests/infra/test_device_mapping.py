"""ROLL's `device_mapping` values read without eval: the forms ROLL's examples use give the GPU indices Python's
eval would give, and anything else is refused with a message naming the offending part."""

from __future__ import annotations

from typing import Any

import pytest

from infra.device_mapping import DeviceMappingError, parse_device_mapping


@pytest.mark.parametrize(
    "text",
    [
        "list(range(0,8))",  # examples/qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml
        "list(range(0,1))",  # the single-node frozen-lake demo
        "list(range(0,4))",  # the multi-node demo: 2 nodes x 2 GPUs
        "list(range(12,16))",  # the RLVR llm_judge reward worker
        "list(range(8))",
        "list(range(0,8,2))",
        "list( range( 0 , 8 ) )",
        "[6, 7]",
        "[0]",
        "[0,1,2,]",
        "[]",
        "[ 0 ,\n 1 ]",
        "list(range(0,4)) + [6, 7]",
        "[0] + list(range(2,4)) + list(range(10, 12))",
        "list([0,1,2,3,8,9,10,11])",  # examples/qwen2.5-7B-rlvr_megatron/rlvr_qwen2.5_7B_seperate.yaml
        "list( [ 4, 5 ] ) + list(range(0,2))",
    ],
)
def test_the_forms_roll_uses_give_what_python_would(text: str) -> None:
    # eval is the reference here only because these literal strings are fixed in the test.
    assert parse_device_mapping(text) == eval(text)


def test_a_yaml_list_of_indices_is_taken_as_is() -> None:
    assert parse_device_mapping([0, 1, 2, 3]) == [0, 1, 2, 3]


def test_indices_keep_their_order_and_repeats() -> None:
    # The caller checks the largest index; keeping the list as given loses nothing for other checks.
    assert parse_device_mapping("[3, 1] + [1]") == [3, 1, 1]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("__import__('os').system('reboot')", ("`list(range(a,b))`", "`__import__('os').system('reboot')` is none")),
        ("range(0,8)", ("`range(0,8)` is none of those",)),
        ("list(range(0,8)", ("is none of those",)),
        ("[0, -1]", ("`[0, -1]` is none of those",)),
        ("[,]", ("`[,]` is none of those",)),  # Python's eval refuses it too
        ("[0 1]", ("is none of those",)),
        ("list(range(0,4)) - [1]", ("is none of those",)),
        ("list(range(0,4)) +", ("`` is none of those",)),
        ("", ("is none of those",)),
        ("list(range(0,4,0))", ("the step of `list(range(0,4,0))` must not be 0",)),
        ("[0.5]", ("is none of those",)),
        ("list([0, x])", ("`list([0, x])` is none of those",)),
        ("list(list([0]))", ("is none of those",)),
        (8, ("must be `list(range(a,b))`, a list of GPU indices",)),
        (None, ("must be `list(range(a,b))`",)),
        ({"start": 0}, ("must be `list(range(a,b))`",)),
        ([0, "1"], ("a list may hold only whole numbers",)),
        ([True, False], ("a list may hold only whole numbers",)),
        ([0.0], ("a list may hold only whole numbers",)),
        ([0, -1], ("must not be negative",)),
    ],
)
def test_anything_else_is_refused_with_the_offending_part(value: Any, words: tuple[str, ...]) -> None:
    with pytest.raises(DeviceMappingError) as caught:
        parse_device_mapping(value)
    for word in words:
        assert word in str(caught.value), str(caught.value)


def test_the_error_is_a_value_error() -> None:
    # Pydantic validators turn ValueError into a configuration problem; any other exception would be a crash.
    assert issubclass(DeviceMappingError, ValueError)
