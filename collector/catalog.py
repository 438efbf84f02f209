"""The documented entry for reading a data dir from Python: ``collector.catalog.connect(D)``.
It is collector.data.catalog."""

from collector.data.catalog import QueryError, connect, ensure_catalog, run_readonly_query

__all__ = ["QueryError", "connect", "ensure_catalog", "run_readonly_query"]
