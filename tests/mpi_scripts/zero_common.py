"""zero_common.py - helpers the ZeRO checkpoint scripts share (no MPI here)."""
import hashlib
import os


def digest(directory):
    """{file name: SHA-256} of a directory: a load must leave it unchanged."""
    return {f: hashlib.sha256(open(os.path.join(directory, f), "rb").read()).hexdigest()
            for f in sorted(os.listdir(directory))}


def refused(fails, what, words, call):
    """call() must raise ValueError with words in a one-line message; else a
    line in fails. Returns the message ("" when accepted)."""
    try:
        call()
        fails.append("%s: accepted" % what)
        return ""
    except ValueError as e:
        if words not in str(e) or "\n" in str(e):
            fails.append("%s: unclear message %r" % (what, str(e)))
        return str(e)
