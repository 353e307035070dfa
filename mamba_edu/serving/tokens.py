"""Token ids checked once: the engine's requests hold :class:`Tokens`, which the radix cache and
the batch builder take as they are, and check anything else they are given."""

from __future__ import annotations


class Tokens(tuple):
    """A tuple of token ids, each an ``int >= 0`` (not a bool, a float or a numpy int), checked
    when it is built, so whoever receives one does not check it again (one pass per prompt, not
    one per layer of the engine). A plain slice is a plain tuple; :meth:`part` keeps the type."""

    __slots__ = ()

    def __new__(cls, ids=(), what: str = "token_ids"):
        ids = tuple(ids)
        if ids and (set(map(type, ids)) != {int} or min(ids) < 0):  # one pass in C, then the culprit
            bad = next(t for t in ids if type(t) is not int or t < 0)
            raise ValueError(f"{what} must be ints >= 0 (not bools, floats or numpy ints); got {bad!r}")
        return super().__new__(cls, ids)

    @classmethod
    def of(cls, ids, what: str = "token_ids") -> Tokens:
        """``ids`` itself if it is a ``Tokens``, else a list or tuple checked into one."""
        if type(ids) is cls:
            return ids
        if not isinstance(ids, (list, tuple)):
            raise ValueError(f"{what} must be a list of ints; got {type(ids).__name__}")
        return cls(ids, what)

    def part(self, start: int = 0, stop: int | None = None) -> Tokens:
        """``self[start:stop]`` as a ``Tokens`` (a part of checked ids needs no check)."""
        return tuple.__new__(Tokens, self[start:stop])
