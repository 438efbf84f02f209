"""The collector service: the gRPC server (service), the Parquet store with its
commit ledger, and background compaction. Never imports torch."""
