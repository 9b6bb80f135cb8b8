"""units.py - reading and writing the model's quantities: latencies ("5us"),
per-byte times or bandwidths ("0.1ns", "10GB/s") and parameter counts
("25.6M", "1.5e9"). Parsers raise ValueError naming the value and the forms
they accept. A time or bandwidth needs its unit: a bare number other than 0
is refused (`--alpha 5` was read as 5 seconds without a word)."""
import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_RATE_UNITS = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
               "kbit/s": 1e3 / 8, "mbit/s": 1e6 / 8, "gbit/s": 1e9 / 8, "tbit/s": 1e12 / 8}
_COUNT_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def _split(text, units):
    m = re.fullmatch(_NUMBER + r"\s*([a-zA-Z/]*)", str(text).strip())
    if not m or m.group(2).lower() not in units:
        return None
    return float(m.group(1)), units[m.group(2).lower()]


def _bare(text, what, forms):
    """0.0 for a bare 0 (the same in every unit); ValueError for any other
    bare number, asking for its unit (forms: '%s' -> the examples); None
    when text is not a bare number."""
    if re.fullmatch(_NUMBER, str(text).strip()) is None:
        return None
    if float(text) == 0:
        return 0.0
    raise ValueError("bad %s %r: a number without a unit; give %s"
                     % (what, text, forms % ((str(text).strip(),) * forms.count("%s"))))


def parse_time(text, what="alpha"):
    """'5us' -> 5e-06 s; '0.005ms', '5e-6s' too; '0' is 0. Must be >= 0."""
    bare = _bare(text, what, "%sus, %sms or %ss")
    if bare is not None:
        return bare
    got = _split(text, _TIME_UNITS)
    if got is None:
        raise ValueError("bad %s %r: give a time such as 5us, 0.8us, 1.5ms or 5e-6s"
                         % (what, text))
    return got[0] * got[1]


def parse_beta(text, what="beta"):
    """Seconds per byte: '0.1ns' (or '0.1 ns/B', as format_beta writes it) ->
    1e-10, '1e-10s', or a bandwidth:
    '10GB/s' -> 1e-10 (GB = 1e9 bytes), '50Gb/s' or '50Gbit/s' (bits) -> 1.6e-10;
    '0' is 0. A bandwidth must be > 0."""
    bare = _bare(text, what, "a time per byte (%sns) or a bandwidth (%sGB/s)")
    if bare is not None:
        return bare
    time = _split(re.sub(r"\s*/\s*B$", "", str(text).strip()), _TIME_UNITS)  # '/B': per byte
    if time is not None:
        return time[0] * time[1]
    # network data sheets give bits: '50Gb/s' (a capital prefix, small b) and
    # '50Gbit/s' are bits per second; 'GB/s' (and all-lowercase 'gb/s') bytes
    text = re.sub(r"(?<=[0-9\s])([kMGT])b/s$", r"\1bit/s", str(text).strip())
    rate = _split(text, _RATE_UNITS)
    if rate is None:
        raise ValueError("bad %s %r: give a time per byte (0.1ns, 1e-10s) or a bandwidth "
                         "(10GB/s, 800MB/s)" % (what, text))
    if rate[0] <= 0:
        raise ValueError("%s bandwidth must be > 0 (got %r)" % (what, text))
    return 1.0 / (rate[0] * rate[1])


def parse_count(text):
    """'25.6M' -> 25600000, '1.5B' / '1.5G' -> 1.5e9, '100k', '25557032', '2.5e7'."""
    got = _split(text, _COUNT_UNITS)
    if got is None:
        return None
    return int(round(got[0] * got[1]))


def format_time(seconds):
    """1.5e-6 -> '1.50 us', 0.0123 -> '12.3 ms'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return "%.3g %s" % (seconds / scale, unit)
    return "%.3g ns" % (seconds / 1e-9)


def format_beta(beta):
    """Seconds per byte as 'x ns/B (y GB/s)'."""
    if beta <= 0:
        return "0 ns/B (unlimited bandwidth)"
    return "%.4g ns/B (%.3g GB/s)" % (beta * 1e9, 1e-9 / beta)
