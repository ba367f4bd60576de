"""Integers and shapes callers pass, checked alike by every Python front end.
numpy's and torch's integers index as ints; a bool, a float or a string is
no rank, size or count (int() would take True as 1 and 1.9 as 1, silently)."""

from __future__ import annotations

import operator

from .errors import InvalidArgumentError


def integer(value, what: str) -> int:
    """`value` as an int, or an error naming `what`."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{what} is {value!r}; expected an integer")
    return operator.index(value)


def shape_of(shape, what: str) -> tuple:
    """The shape of a tensor ferry makes: an int or a sequence of sizes, each
    0 or more (-1, torch's "infer it", has nothing to infer from in a new
    tensor), as a tuple of ints, or an error naming `what`."""
    dims = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise InvalidArgumentError(f"{what}: shape is {shape!r}; expected a tuple of sizes") from None
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__") or int(d) < 0:
            raise InvalidArgumentError(f"{what}: shape is {shape!r}; expected sizes of at least 0")
    return tuple(int(d) for d in dims)
