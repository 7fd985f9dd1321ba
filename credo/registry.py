"""credo's one registry mechanism: a name -> entry table with lookup suggestions, a listing and lazy built-ins.

Every pluggable choice (policy losses, advantage estimators, critic losses, verifiers, environments, tasks,
collectors, batch transforms, loss terms, config sections and choices, ...) is one :class:`Registry`::

    LOSSES = Registry("policy loss", builtins=("credo.algo.losses",))

    @LOSSES.register("my_loss")           # a decorator ...
    def my_loss(...): ...
    LOSSES.add("other", entry)            # ... or a call
    LOSSES.get("my_los")                  # UnknownName: unknown policy loss 'my_los' (did you mean 'my_loss'?)
    LOSSES.names()                        # sorted, built-ins included

``builtins`` names the modules whose import registers the built-in entries. They are imported on the first lookup
or listing, by name: the registry sits below the packages that fill it (a method package registers into a table
of ``credo.algo`` or ``credo.config``), so naming them keeps the import graph layered (tests/test_architecture.py)
while the table still lists every built-in without its user importing anything first. A plugin (``--plugin``,
``plugins:``) registers the same way a built-in module does: by being imported.

Registering a *different* entry under a taken name raises ``ValueError``; re-registering the same definition (a
module imported twice, a reload) is a no-op.
"""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no entry of a registry has; the message lists the close matches and the registered names."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


def _same(a: Any, b: Any) -> bool:
    """The same object, or the same definition executed again (its module imported twice)."""
    if a is b:
        return True
    key = lambda x: (getattr(x, "__module__", None), getattr(x, "__qualname__", None))  # noqa: E731
    return key(a) == key(b) and None not in key(a)  # an instance has its class's __module__ but no __qualname__


class Registry(Generic[T]):
    """A table of named entries of one kind (see the module docstring)."""

    def __init__(self, kind: str, *, builtins: tuple[str, ...] = (), same: Callable[[T, T], bool] = _same):
        self.kind = kind
        self.builtins = tuple(builtins)
        self._entries: dict[str, T] = {}
        self._loaded = not self.builtins
        self._same = same

    # ------------------------------------------------------------------ registering

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``; returns it."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: invalid name {name!r}")
        self.refuse_taken(name, entry)
        self._entries[name] = entry
        return entry

    def refuse_taken(self, name: str, entry: T) -> None:
        """Raise the ValueError :meth:`add` would for ``entry`` under ``name``, before building the entry (a
        registering decorator checks the name first); the built-ins are not imported."""
        old = self._entries.get(name)
        if old is not None and not self._same(old, entry):
            raise ValueError(f"{self.kind} {name!r} is already registered ({_describe(old)})")

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""
        return lambda entry: self.add(name, entry)

    def remove(self, name: str) -> None:
        """Drop ``name`` (tests that register a throw-away entry clean up with this)."""
        self._entries.pop(name, None)

    # ------------------------------------------------------------------ reading

    def load_builtins(self) -> None:
        """Import the modules that register the built-in entries (once)."""
        if self._loaded:
            return
        self._loaded = True  # before the imports: a built-in module may read the table while it registers
        for module in self.builtins:
            importlib.import_module(module)

    def get(self, name: str) -> T:
        """The entry registered under ``name``; :class:`UnknownName` (a KeyError and a ValueError) otherwise."""
        if name not in self._entries:
            self.load_builtins()
        if name in self._entries:
            return self._entries[name]
        raise UnknownName(self.unknown(name))

    def unknown(self, name: Any) -> str:
        """The message for an unknown ``name``: a close match when there is one, and the registered names."""
        self.load_builtins()
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; registered: {', '.join(sorted(self._entries)) or 'none'}"

    def names(self) -> list[str]:
        self.load_builtins()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self.load_builtins()
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self.load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self.load_builtins()
        return len(self._entries)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} entries)"


def _describe(entry: Any) -> str:
    module, qual = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    if module and qual:
        return f"to {module}.{qual}"
    fn = getattr(entry, "fn", None)  # an entry wrapping a function (credo.algo's Registered) names the function
    return _describe(fn) if callable(fn) else f"to {entry!r}"[:200]
