"""causes.py - one line per cause when ranks fail with an error hpcdl raised
itself (a mismatch, bad data, a config or checkpoint problem), instead of
every rank's traceback in the launcher's banners.

Rank side (report, from the uncaught-exception hook in hpcdl.comm): when the
launcher asked for it (HPCDL_CAUSES=1, set by `hpcdl run` / `hpcdl train`)
and the exception's class is hpcdl's, the rank writes its traceback and one
cause record to stderr as marked lines, in one write. Marked lines travel
through mpirun / srun from any host like the rest of stderr.

Launcher side (Sieve, on the launcher's stderr): marked lines, the core's
one-line verdicts (a stall, a rank that finished early), the ranks' own
'hpcdl: error: [rank R] ...' lines (a bad path or a checkpoint that does
not fit, said by every rank) and, once a cause
was seen, the launcher's own abort banners go to a log file; every
other line passes through at once. At the end the launcher prints one line
per distinct cause (its ranks, its message, which carries hpcdl's hint) and
names the log file when it holds a traceback the terminal did not show; a
log of nothing more than the lines said (a usage error every rank refused,
the stall inspector's verdict) and the launcher's banners is removed, and so
is every log of a job that succeeded (issue 38: every failed `hpcdl run` left
a /tmp/hpcdl-errors-*.log). `--tracebacks` keeps everything on the terminal.
"""
import json
import os
import re
import sys
import tempfile
import traceback

MARK = "\x1bhpcdl-cause"   # a cause record: MARK + " " + json
TB_MARK = "\x1bhpcdl-tb"   # a traceback line: TB_MARK + " R " + text
ENV = "HPCDL_CAUSES"


def ours(exc_type):
    """Errors hpcdl raises with a message meant for the user (classes of hpcdl's
    own modules: MismatchError, DataError, ConfigError, ...)."""
    return getattr(exc_type, "__module__", "").split(".")[0] == "hpcdl"


def report(exc_type, exc, tb, rank):
    """Writes the uncaught exception to stderr: marked for the launcher (True)
    when it asked and the error is hpcdl's, else Python's traceback (False)."""
    if os.environ.get(ENV) != "1" or not ours(exc_type):
        traceback.print_exception(exc_type, exc, tb)
        return False
    lines = "".join(traceback.format_exception(exc_type, exc, tb)).splitlines()
    record = {"rank": rank, "type": exc_type.__name__, "message": str(exc)}
    text = "".join("%s %d %s\n" % (TB_MARK, rank, line) for line in lines)
    text += "%s %s\n" % (MARK, json.dumps(record))
    sys.stderr.flush()
    os.write(2, text.encode("utf-8", "replace"))
    return True


# ------------------------------------------------------------ launcher side
# what Open MPI / MPICH print around an abort, once the cause is known
# (and torch's warning, with its source line, before it fails on an unregistered
# backend "hpcdl": KNOWN below says what to do)
NOISE = re.compile(r"ORTE_ERROR_LOG|more process(es)? ha(s|ve) sent help message|"
                   r"orte_base_help_aggregate|uncaught \w+; ending the job|"
                   r"application called MPI_Abort|BAD TERMINATION|^\s*=+\s*$|"
                   r"Device capability of hpcdl unknown|^\s+backend_config = BackendConfig")
DASHES = re.compile(r"^-{20,}\s*$")
# the core's own verdicts (src_c/stall.c), one line from each rank that says it
CORE_VERDICT = re.compile(r"^\[rank (\d+)\] error: ((stall inspector:|rank \d+ finished) .*)$")
# a problem a rank refuses in one line (cli/main.py print_errors, cli/train.py:
# a bad path, a checkpoint that does not fit): each rank says it, status 2
RANK_ERROR = re.compile(r"^hpcdl: error: \[rank (\d+)\] (.*)$")
# a rank's plain Python traceback (an error before hpcdl's hook is installed:
# before comm.init / hvd.init, or torch's own): held until its last line says
# what it was; one of hpcdl's classes, or a mistake KNOWN here, becomes one
# cause line, anything else is shown as it came
TRACEBACK = "Traceback (most recent call last):"
OURS_LAST = re.compile(r"^hpcdl(?:\.\w+)*\.(\w+): (.*)$")  # hpcdl.torch.exceptions.X: msg
KNOWN = [
    # dist.init_process_group("hpcdl") without the import that registers it
    (re.compile(r"Unknown (?:c10d )?backend type:? '?hpcdl'?|Invalid backend: 'hpcdl'"),
     'torch.distributed has no backend "hpcdl": import hpcdl.torch (or '
     'hpcdl.torch.distributed) before dist.init_process_group("hpcdl"); the import '
     'registers it'),
]
# banners of a job ending: held until the end when no cause is known yet (the
# launcher's own messages may overtake the ranks' forwarded stderr)
ENDING = re.compile(r"MPI_ABORT was invoked|Primary job +terminated|noticed that process "
                    r"rank|has exited due to process rank|exited on signal|"
                    r"exited with non-zero status")


class Sieve:
    """Reads the launcher's stderr (a binary stream) line by line: marked
    lines and, after a cause, the launchers' abort noise go to the log;
    the rest to out. causes: [(type, message, [ranks])] in order seen."""

    def __init__(self, out=None):
        self.out = out or sys.stderr
        self.causes = []
        self.path = None
        self._log = None
        self._block = None  # lines of an open ------ banner
        self._held = []     # ending noise seen before any cause: decided at the end
        self.tracebacks = 0  # traceback lines logged (what makes the log worth keeping)
        self._tb = None     # lines of a plain traceback, until its last line
        self._plain = []    # plain tracebacks taken as causes (shown after all if the job succeeds)

    def log(self, line):
        if self._log is None:
            fd, self.path = tempfile.mkstemp(prefix="hpcdl-errors-", suffix=".log")
            self._log = os.fdopen(fd, "w")
        self._log.write(line if line.endswith("\n") else line + "\n")

    def _show(self, line):
        self.out.write(line)
        self.out.flush()

    def feed(self, line):
        if self._tb is not None or line.startswith(TRACEBACK) or self._tail_of_another(line):
            self._traceback(line)
            return
        if TB_MARK in line:
            rank, _, text = line.split(TB_MARK, 1)[1][1:].partition(" ")
            self.log("[rank %s] %s" % (rank, text))
            self.tracebacks += 1
            return
        if MARK in line:
            self._cause(line.split(MARK, 1)[1])
            return
        verdict = CORE_VERDICT.match(line.strip())
        if verdict:
            self._add(None, verdict.group(2), int(verdict.group(1)))
            return
        refused = RANK_ERROR.match(line.strip())
        if refused:
            self._add("error", refused.group(2), int(refused.group(1)))
            return
        if self._block is not None:  # inside a banner: decide at its end
            self._block.append(line)
            if DASHES.match(line):
                self._end_block()
            return
        if DASHES.match(line):
            self._block = [line]
            return
        if NOISE.search(line):
            self._noise([line])
        else:
            self._show(line)

    def _tail_of_another(self, line):
        """Two ranks' tracebacks can arrive interleaved line by line: the
        second's header joins the first's block, and its frames come after
        that block closed. After a plain traceback was taken as a cause, an
        indented frame line opens a held block again (shown as it came if
        its last line names nothing known)."""
        return bool(self._plain) and line.startswith(("  File ", "    "))

    def _traceback(self, line):
        if self._tb is None or line.startswith((" ", "\t", TRACEBACK)) or not line.strip():
            self._tb = (self._tb or []) + [line]
            return
        block, self._tb = self._tb + [line], None
        last = line.strip()
        ours = OURS_LAST.match(last)
        hint = next((h for pattern, h in KNOWN if pattern.search(last)), None)
        if not ours and not hint:
            self._show("".join(block))
            return
        for text in block:
            self.log(text)
        self.tracebacks += len(block)
        self._plain.append("".join(block))
        self._add(ours.group(1) if ours else "error", ours.group(2) if ours else hint, None)

    def _noise(self, lines):
        if self.causes:
            for line in lines:
                self.log(line)
        else:
            self._held += lines

    def _end_block(self):
        block, self._block = self._block, None
        if self.causes or ENDING.search("".join(block)):
            self._noise(block)
        else:
            self._show("".join(block))

    def _cause(self, payload):
        try:
            rec = json.loads(payload)
        except ValueError:
            return
        message = re.sub(r"^\[rank \d+\]\s*", "", str(rec.get("message", "")))
        self._add(rec.get("type"), message, rec.get("rank"))

    def _add(self, kind, message, rank):
        """One more rank for the cause (kind None: the core's verdict, said by rank)."""
        message = " ".join(message.split())
        for known, text, ranks in self.causes:
            if (known, text) == (kind, message):
                ranks.append(rank)
                break
        else:
            self.causes.append((kind, message, [rank]))
        self.log("[rank %s] %s: %s" % (rank, kind or "error", message))

    def run(self, stream):
        """Feeds every line of stream (bytes); returns at its end."""
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            try:
                self.feed(line)
            except Exception:  # never stop draining: a full pipe would block the job
                try:
                    self._show(line)
                except Exception:
                    pass
        if self._tb is not None:  # cut short: as it came
            self._show("".join(self._tb))
            self._tb = None
        if self._block is not None:
            self._end_block()
        held, self._held = self._held, []
        if held:
            self._noise(held) if self.causes else self._show("".join(held))
        if self._log is not None:
            self._log.close()

    def finish(self, failed):
        """The launcher's lines at the job's end (summary()); the log is kept
        only when the job failed and it holds tracebacks, else removed. A job
        that succeeded shows the plain tracebacks it held back (a script that
        caught an error and printed it went on)."""
        if not failed and self._plain:
            self._show("".join(self._plain))
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.path and not (failed and self.tracebacks):
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None
        return self.summary()

    def summary(self):
        """The launcher's lines: one per distinct cause, then the log's name."""
        out = []
        for kind, message, ranks in self.causes:
            out.append("%s (said by %s)" % (message, rank_list(ranks)) if kind is None
                       else "%s on %s: %s" % (kind, rank_list(ranks), message))
        if self.path:
            out.append("full tracebacks and the launcher's messages: %s (--tracebacks shows "
                       "them here)" % self.path)
        return out


def rank_list(ranks):
    """[0, 1, 2, 5] -> 'ranks 0-2,5'; [3] -> 'rank 3'; [None, None] (a plain
    traceback does not say whose it is) -> '2 ranks'."""
    count, ranks = len(ranks), sorted({r for r in ranks if isinstance(r, int)})
    if not ranks:
        return "a rank" if count < 2 else "%d ranks" % count
    parts, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur is None or cur != prev + 1:
            parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
            start = cur
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)
