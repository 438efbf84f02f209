"""What runs inside a training process: instrumented collectives (ops, recorder,
summary), the telemetry session and the client that ships its records, the spool,
the clock and the hook. Imports torch lazily where it can; never duckdb,
streamlit or plotly, so a training rank loads none of them."""
