"""cache.py - ChunkCache: the in-memory level of the data cache. Holds recently
read chunks (a block of chunk_rows samples of one shard, as read from HDF5)
per process, least recently used out first, bounded in bytes. Each DataLoader
worker has its own (they are separate processes)."""
from collections import OrderedDict

from ..utils import settings

DEFAULT_BYTES = settings.get("HPCDL_DATA_CACHE_BYTES")


class ChunkCache:
    def __init__(self, max_bytes=None):
        self.max_bytes = DEFAULT_BYTES if max_bytes is None else int(max_bytes)
        self._items = OrderedDict()  # key -> (value, nbytes)
        self.nbytes = 0
        self.hits = self.misses = 0

    def get(self, key, load):
        """The value for key; load() -> (value, nbytes) on a miss."""
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]
        self.misses += 1
        value, nbytes = load()
        if nbytes <= self.max_bytes:
            self._items[key] = (value, nbytes)
            self.nbytes += nbytes
            while self.nbytes > self.max_bytes:
                _, (_, n) = self._items.popitem(last=False)
                self.nbytes -= n
        return value

    def clear(self):
        self._items.clear()
        self.nbytes = 0
