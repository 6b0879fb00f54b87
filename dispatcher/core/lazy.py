"""An attribute computed once per object, without a lock.

``functools.cached_property`` (before Python 3.12) computes under one lock per property that
every object of the class shares: a thread computing one object's value (a round tree's
nodes, a job's source hash, which reads files) holds up every other thread that asks *any*
object of the class for it, for as long as the scheduler keeps the first thread off the CPU.
The master asks from dozens of threads at once (the chains, the compile pool, the
comparisons), and its chains were seen waiting there more than computing.  ``cached`` takes no
lock: two threads that miss at once both compute the value (it must be a pure function of the
object) and either result is kept.
"""
from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar, overload

T = TypeVar("T")


class cached(Generic[T]):  # noqa: N801 (used as a decorator, as cached_property is)
    """``@cached`` on a method: its value, computed on first use and kept in the object's
    ``__dict__`` (so it works on frozen dataclasses, as ``cached_property`` does)."""

    def __init__(self, func: Callable[[Any], T]):
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> T | cached[T]:
        if instance is None:
            return self
        value = self.func(instance)
        instance.__dict__[self.name] = value  # found there from now on: no descriptor call
        return value
