"""What runs inside a training process: instrumented collectives (ops, recorder,
summary), the telemetry session and the client that ships its records, the spool,
the clock and the hook with what it adds to a script: its steps (steps), its own metrics
(metrics, ``hook.log``) and what DeepSpeed reports (deepspeed). Imports torch lazily where it can; never duckdb,
streamlit or plotly, so a training rank loads none of them."""
