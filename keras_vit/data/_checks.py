"""Argument checks of `keras_vit.data`, run in Python when a pipeline is built.

Every failure names the argument and the value received, in one format:
"`name` must be <requirement>. Received: name=<value!r>".
"""

from keras_vit.layers.utils import is_int, is_real


def fail(name, value, requirement, error=ValueError):
    """Raises `error` saying what `name` must be and what it received."""
    raise error(f"`{name}` must be {requirement}. Received: {name}={value!r}")


def integer(value, name, minimum=1):
    """`value` as an int >= `minimum` (the default 1: a positive int)."""
    if not is_int(value) or value < minimum:
        fail(name, value, "a positive int" if minimum == 1 else f"an int >= {minimum}")
    return int(value)


def number(value, name, minimum=0, strict=False):
    """A finite real number (no bool) >= `minimum`, or > `minimum` with
    `strict` (an infinite mixup alpha gave NaN batches)."""
    ok = is_real(value)
    if not (ok and (value > minimum if strict else value >= minimum)):
        fail(name, value, f"a finite number {'>' if strict else '>='} {minimum}")
    return value


def boolean(value, name):
    if not isinstance(value, bool):
        fail(name, value, "a bool")
    return value


def one_of(value, name, choices):
    if value not in choices:
        fail(name, value, f"one of {choices}")
    return value


def size_pair(size, name="size"):
    """`(height, width)` from an int or a pair of positive ints."""
    if is_int(size):
        pair = (size, size)
    elif isinstance(size, (tuple, list)) and len(size) == 2 and all(is_int(s) for s in size):
        pair = tuple(size)
    else:
        pair = None
    if pair is None or min(pair) <= 0:
        fail(name, size, "a positive int or a pair (height, width) of positive ints")
    return int(pair[0]), int(pair[1])


def value_range(value, name, low, high):
    """`(min, max)` as floats with `low <= min <= max <= high`."""
    try:
        pair = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or not (low <= pair[0] <= pair[1] <= high):
        fail(name, value, f"a pair (min, max) with {low} <= min <= max <= {high}")
    return pair
