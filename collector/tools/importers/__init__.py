"""Importers for DeepSpeed's own outputs, one module per format:

- ``csv_monitor``   -- csv_monitor's ``<tag>.csv`` files          -> monitor
- ``tensorboard``   -- the tensorboard monitor's event files        -> monitor
- ``comms_summary`` -- ``deepspeed.comm.log_summary(return_dict=True)`` saved as JSON -> comm
- ``comms_verbose`` -- the comms logger's verbose console lines     -> comm
- ``flops_text``    -- the flops profiler's output_file report      -> flops
- ``flight_recorder`` -- PyTorch Flight Recorder dumps (JSON, pickle) -> comm, inflight, stacks
- ``torch_profiler`` -- torch.profiler Chrome traces, one per rank -> comm, timers
- ``parquet_table`` -- a table as ``rankscope export --parquet`` wrote it

``dispatch.parse_path(path)`` finds and parses them all; ``sink`` delivers the
rows (into a data dir or through a live collector). Each importer's docstring
says exactly how DeepSpeed's numbers map onto rankscope's columns.
"""
