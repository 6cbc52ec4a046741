"""The engine's names for :mod:`voxcast.memory` (resident memory, returning freed heap pages).

The functions live in :mod:`voxcast.memory`, which the audio layer uses too; import them from there.
"""

from voxcast.memory import rss_mb, trim_heap

__all__ = ["rss_mb", "trim_heap"]
