"""manifest.py - the shard directory's manifest.json: what hpcdl data shard
wrote (splits, shard files, sample counts, shape, dtype, classes, per-block
checksums, format version), how shard files are named, and DataError.

A shard file holds three datasets of equal length n:
    x              (n, *sample_shape) stored dtype, or (n,) variable-length uint8
                   (encoded image bytes) when the manifest's encoding is "image"
    y              (n,) int64 class labels in [0, num_classes)
    source_index   (n,) int64 position of each sample in its split of the source
Checksums: for each field, one CRC-32 per block of chunk_rows rows (the HDF5
chunk), so a mismatch names the rows it is in.
"""
import json
import os
import zlib

import numpy as np

from ..utils.atomic import write_json

FORMAT = "hpcdl-h5-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
FIELDS = ("x", "y", "source_index")
ENCODINGS = ("raw", "image")
SPLITS = ("train", "val")


class DataError(Exception):
    """Bad data: the message names the file, the index or field, what is wrong
    and what to do."""


def shard_name(split, index, count):
    return "%s-%05d-of-%05d.h5" % (split, index, count)


# ---------------------------------------------------------------- checksums
def block_digest(block):
    """CRC-32 (8 hex digits) of one block of a field: a numeric array, or for
    encoded images a sequence of uint8 arrays (their lengths, then their bytes).
    A storage checksum, not a cryptographic one: several times cheaper to
    compute on every chunk read than a hash."""
    if isinstance(block, np.ndarray) and block.dtype != object:
        crc = zlib.crc32(np.ascontiguousarray(block).view(np.uint8).reshape(-1).data)
    else:
        items = [np.asarray(b, dtype=np.uint8) for b in block]
        crc = zlib.crc32(np.array([len(b) for b in items], dtype=np.int64).tobytes())
        for b in items:
            crc = zlib.crc32(b.data, crc)
    return "%08x" % crc


def block_digests(values, rows):
    """One digest per block of `rows` rows of values (numpy array or list)."""
    return [block_digest(values[lo:lo + rows]) for lo in range(0, len(values), rows)]


# ---------------------------------------------------------------- reading
class Manifest:
    """manifest.json of a shard directory, checked on load.

    Attributes: directory, doc (the parsed JSON), num_classes, class_names,
    sample_shape (tuple, or None for encoded images of mixed sizes), dtype,
    encoding ("raw" | "image"), channels (images), chunk_rows, splits.
    """

    def __init__(self, directory):
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, MANIFEST)
        self.doc = self._read()
        d = self.doc
        self.num_classes = int(d["num_classes"])
        self.class_names = list(d["class_names"])
        self.sample_shape = None if d["sample_shape"] is None else tuple(d["sample_shape"])
        self.dtype = np.dtype(d["dtype"])
        self.encoding = d["encoding"]
        self.channels = d.get("channels")
        self.chunk_rows = int(d["chunk_rows"])
        self.splits = d["splits"]
        self._check()

    def _read(self):
        if not os.path.isdir(self.directory):
            raise DataError("%s: no such directory; write shards there with "
                            "'hpcdl data shard SOURCE --out %s'" % (self.directory,
                                                                     self.directory))
        if not os.path.exists(self.path):
            raise DataError("%s: missing; %s is not a complete shard directory (an "
                            "interrupted 'hpcdl data shard' writes no manifest): shard again"
                            % (self.path, self.directory))
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise DataError("%s: not readable JSON (%s); shard again" % (self.path, e))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise DataError("%s: not an hpcdl shard manifest (format %r)"
                            % (self.path, doc.get("format") if isinstance(doc, dict) else None))
        if doc.get("format_version") != FORMAT_VERSION:
            raise DataError("%s: format version %r, this hpcdl reads version %d; shard the "
                            "source again with this hpcdl"
                            % (self.path, doc.get("format_version"), FORMAT_VERSION))
        missing = [k for k in ("num_classes", "class_names", "sample_shape", "dtype",
                               "encoding", "chunk_rows", "splits") if k not in doc]
        if missing:
            raise DataError("%s: field(s) %s missing" % (self.path, ", ".join(missing)))
        return doc

    def _check(self):
        bad = None
        if self.encoding not in ENCODINGS:
            bad = "encoding %r (expected one of %s)" % (self.encoding, ", ".join(ENCODINGS))
        elif len(self.class_names) != self.num_classes:
            bad = "%d class names for %d classes" % (len(self.class_names), self.num_classes)
        elif self.chunk_rows < 1:
            bad = "chunk_rows %d" % self.chunk_rows
        for name, split in self.splits.items():
            try:
                shards = split["shards"]
                keys = [k for s in shards for k in ("file", "num_samples", "bytes",
                                                    "checksums") if k not in s]
                counts = [s["num_samples"] for s in shards]
                total = split["num_samples"]
            except (KeyError, TypeError) as e:
                raise DataError("%s: split %r is malformed (%s); shard again"
                                % (self.path, name, e))
            if keys:
                bad = "split %r: a shard entry lacks %r" % (name, keys[0])
            elif sum(counts) != total:
                bad = "split %r: shards hold %d samples, the split says %d" % (
                    name, sum(counts), total)
        if bad:
            raise DataError("%s: %s; the manifest is inconsistent, shard again" % (self.path, bad))

    def split(self, name):
        """The split's entry: {"num_samples": N, "shards": [{"file", "num_samples",
        "bytes", "checksums": {field: [digest per block]}}]}."""
        if name not in self.splits:
            raise DataError("%s has no split %r; it has: %s"
                            % (self.directory, name, ", ".join(sorted(self.splits)) or "none"))
        return self.splits[name]

    def shard_path(self, shard):
        return os.path.join(self.directory, shard["file"])


def write_manifest(directory, doc):
    """Writes manifest.json atomically (a reader never sees half of it)."""
    return write_json(os.path.join(directory, MANIFEST), doc, indent=1)
