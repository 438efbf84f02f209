"""rankscope's telemetry, by role (docs/ARCHITECTURE.md):

- ``collector.rank``: what runs inside a training process (instrumented ops, the
  recorder, the session and client that ship records, the spool, the hook);
- ``collector.data``: the data contract both ends share (schema, layout, codec,
  the catalog's views, configuration, token/TLS helpers); no torch;
- ``collector.server``: the gRPC collector, the Parquet store, ledger and compaction; no torch;
- ``collector.tools``: the command line and offline tools (demo, import, replay,
  export, watch, sql).

Dependencies point one way: tools -> server -> data -> proto, rank -> data -> proto.
``collector.hook`` and ``collector.catalog`` are the documented entries.
"""
