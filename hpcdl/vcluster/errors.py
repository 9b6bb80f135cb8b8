"""errors.py - the one exception the vcluster raises to its callers:
something a user can fix or must know, as one line."""


class VclusterError(Exception):
    """One line for the user ('hpcdl: error: ...'), non-zero exit."""
