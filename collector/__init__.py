"""rankscope's telemetry: the rank side (instrumented collectives, records, the
client that ships them, the hook) and the server side (gRPC collector, Parquet
store, DuckDB catalog). The server side never imports torch."""
