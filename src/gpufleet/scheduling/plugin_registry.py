"""A registry of plugins by extension point and name; it refuses duplicate names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from gpufleet.domain.errors import GpufleetError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[[], T]] = {}

    def register(self, name: str, factory: Callable[[], T]) -> None:
        if name in self._factories:
            raise GpufleetError(f"a {self.kind} plugin named {name!r} is registered already", "pick another name")
        self._factories[name] = factory

    def create(self, name: str) -> T:
        factory = self._factories.get(name)
        if factory is None:
            raise UnknownNameError(f"no {self.kind} plugin named {name!r}", f"use one of: {', '.join(self.names())}")
        return factory()

    def names(self) -> list[str]:
        return sorted(self._factories)
