"""``Record``: a ``typing.NamedTuple`` for the header-only path, without importing ``typing``.

``python -m loadkit inspect`` on a header pays for every import: ``typing`` takes about 2.5 ms,
and each ``typing.NamedTuple`` class about 0.3 ms more (it compiles every annotation, a string
here, into a ``ForwardRef``), a tenth of a whole run between them. A class written
``class TensorInfo(Record):`` with annotated fields, exactly as for a NamedTuple, is one to a type
checker (it sees ``typing.NamedTuple``); at run time it is a ``collections.namedtuple`` of those
fields, their defaults, and the body's methods, properties and docstring: the same class to
anyone using it (``_replace``, pickling, the repr).

>>> class Point(Record):
...     '''A point.'''
...     x: int
...     y: int = 0
...     @property
...     def norm1(self) -> int:
...         return abs(self.x) + abs(self.y)
>>> Point(3), Point(3, -4).norm1, Point._fields, Point.__doc__
(Point(x=3, y=0), 7, ('x', 'y'), 'A point.')
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers see True)

if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    from collections import namedtuple

    # What the class body may not set: namedtuple makes these itself.
    _NAMEDTUPLE_OWN = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields",
                                 "_field_defaults", "_make", "_replace", "_asdict"})  # fmt: skip
    _NOT_COPIED = frozenset({"__module__", "__qualname__"})

    class _RecordType(type):
        def __new__(mcs, name: str, bases: tuple[type, ...], body: dict[str, object]) -> type:
            fields = list(body.get("__annotations__", {}))
            defaults = [body[f] for f in fields if f in body]
            if any(f not in body for f in fields[len(fields) - len(defaults) :]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            cls = namedtuple(name, fields, defaults=defaults, module=body["__module__"])
            cls.__qualname__ = body.get("__qualname__", name)
            for key, value in body.items():
                if key in _NAMEDTUPLE_OWN:
                    raise AttributeError(f"{name}: cannot set {key} on a record")
                if key not in _NOT_COPIED and key not in fields:
                    setattr(cls, key, value)
            return cls

    Record = type.__new__(_RecordType, "Record", (), {})

__all__ = ["Record"]
