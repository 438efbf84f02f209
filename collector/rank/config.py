"""The config base for blocks read inside a training process: collector.data.config's
``ConfigBlock``, ``setting``, ``derived`` and ``ConfigError``, the same objects.

The base lives in collector.data because the collector's own blocks (store, compaction,
limits) build on it too, and the server never imports the rank side. The engine
(``trainer/``) reaches collector only through collector.rank (DESIGN: trainer ->
collector.rank), so its DeepSpeed sections take the base from here.
"""

from collector.data.config import ConfigBlock, ConfigError, derived, setting

__all__ = ["ConfigBlock", "ConfigError", "derived", "setting"]
