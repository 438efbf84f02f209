"""The collector service: the gRPC server (service; settings and serve: one run from its
settings), the Parquet store with its commit ledger, and background compaction. Never imports
torch."""
