"""Things built by name (drafter kinds, calibrators, draft policies, export formats): one kind of
registry for all of them, and one error for a name none holds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


class UnknownNameError(ValueError):
    """A name a registry does not hold; the message names what was asked for and lists the
    names it knows (the command line prints it as its one-line error)."""


class Registry(Generic[Entry]):
    """Entries by name. `what` says what the names are (e.g. "drafter kind") in errors."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, Entry] = {}

    def add(self, name: str, entry: Entry) -> Entry:
        """Hold `entry` as `name`; a second entry under one name is an error."""
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered by {self._entries[name]}")
        self._entries[name] = entry
        return entry

    def register(self, name: str, attribute: str = "kind") -> Callable[[Entry], Entry]:
        """Class decorator: hold the class as `name` and set its `attribute` to the name."""

        def register(cls: Entry) -> Entry:
            setattr(cls, attribute, name)
            return self.add(name, cls)

        return register

    def __getitem__(self, name: str) -> Entry:
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.what} {name!r}; choose one of {self.names()}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """Every name held, sorted."""
        return sorted(self._entries)
