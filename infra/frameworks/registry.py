"""The frameworks the program runs, by the name a user writes as training.framework.

Adding a framework is its adapter module (infra/frameworks/<name>.py: a FrameworkFacts subclass with the
FrameworkAdapter methods), its config class (a field of TrainingConfig) and one line here; docs/adding-a-framework.md
lists the rest a new framework may need. Everything that differs by framework asks the adapter class found here
(training.framework's allowed values, the accelerators it runs on, its first-step line, whether its models are
prefetched), so no table elsewhere is keyed by a framework's name.
"""

from __future__ import annotations

from infra.frameworks.base import FrameworkAdapter
from infra.frameworks.custom import CustomAdapter
from infra.frameworks.mindspeed_rl import MindSpeedRlAdapter
from infra.frameworks.openrlhf import OpenRlhfAdapter
from infra.frameworks.roll import RollAdapter
from infra.frameworks.verl import VerlAdapter

FRAMEWORKS: dict[str, type[FrameworkAdapter]] = {
    adapter.name: adapter
    for adapter in (RollAdapter, VerlAdapter, OpenRlhfAdapter, MindSpeedRlAdapter, CustomAdapter)
}


def framework_names() -> tuple[str, ...]:
    """training.framework's allowed values, in the registry's order."""
    return tuple(FRAMEWORKS)


def adapter_class(name: str) -> type[FrameworkAdapter]:
    """The adapter class of a registered framework (KeyError naming the registered ones for any other)."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise KeyError(f"no framework {name!r} is registered (registered: {', '.join(FRAMEWORKS)})") from None
