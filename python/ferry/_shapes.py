"""The shape of a tensor ferry makes: an int or a sequence of ints, each 0 or
more. numpy's and torch's integers index as ints; a bool, a float or -1 (torch's
"infer it": a new tensor has nothing to infer from) is no size."""

from __future__ import annotations

from .errors import InvalidArgumentError


def shape_of(shape, what: str) -> tuple:
    """`shape` as a tuple of ints, or an error naming `what`."""
    dims = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise InvalidArgumentError(f"{what}: shape is {shape!r}; expected a tuple of sizes") from None
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__") or int(d) < 0:
            raise InvalidArgumentError(f"{what}: shape is {shape!r}; expected sizes of at least 0")
    return tuple(int(d) for d in dims)
