"""_checks.py - argument checks shared by hpcdl.optim: a ValueError that names
the argument, what it must be and what it got."""
import math
import numbers


def check_number(name, value, low=0.0, strict=False, high=None):
    """value must be a finite real >= low (> low when strict), <= high if given."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low) or (high is not None and value > high):
        bound = "%s %g" % (">" if strict else ">=", low)
        if high is not None:
            bound += " and <= %g" % high
        raise ValueError("%s must be a number %s, got %r" % (name, bound, value))


def check_count(name, value, what="a count"):
    """value must be an integer >= 1."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError("%s must be a positive integer (%s), got %r" % (name, what, value))
