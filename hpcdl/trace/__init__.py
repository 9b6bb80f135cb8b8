"""hpcdl.trace - timelines of communication (Chrome trace JSON)."""
from .timeline import Timeline, active, start_timeline, stop_timeline

__all__ = ["Timeline", "active", "start_timeline", "stop_timeline"]
