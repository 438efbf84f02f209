"""The testing kit: what rankscope's own tests and benchmarks (and anyone testing a
producer or a dashboard against rankscope) need to stand up real parts quickly.

- ``ports``: ``free_port()`` for a child that must be told its port.
- ``collectors``: ``live_collector(data_dir)``, a real in-process collector (gRPC on
  port 0, Parquet + catalog in ``data_dir``); ``stored_rows`` counts what it committed.
  For a collector in its own process use ``collector.tools.launch.CollectorProcess``.
- ``streams``: ``RawStream``, one Stream RPC driven envelope by envelope.
- ``fake_runs``: ``FakeRun``, a synthetic multi-rank run with a known story (a late
  rank, overflow steps, uneven experts), written into a data dir or streamed as a
  rank would; plus the envelope building blocks protocol tests send and ``StoreFeed``
  (a run's rows straight into a Store).
- ``flops_models``: small GPT / BERT / CNN models and the analytic SDPA flops count
  the flops profiler is checked with (the only module here that imports torch).
- ``dashboard``: ``rankscope dashboard`` as a child process and headless Chromium.
- ``gloo``: ranks of a real gloo world in spawned processes, as torchrun starts them (``start_ranks``,
  ``join_ranks``, ``wait_for``; ``torchrun_env`` in each rank); torch is imported when ranks start.
- ``pki``: a throwaway CA and server certificate made with the openssl CLI.
- ``slow_storage``: ``SlowStorage``, a file a checkpoint save into takes a set time (its stack shows the save).
- ``webhook``: ``WebhookReceiver``, a local endpoint the collector's alert webhook posts to.
- ``prometheus``: ``PrometheusProcess``, Debian's Prometheus server scraping given targets.
- ``step_frames``: ``step_rows``, per-step analysis frames with a known straggler story.
- ``netns``: several "hosts" on one machine (network namespaces through a bridge, a host's link
  throttled with tc tbf mid-run, ``StepControl`` to act at a training step); ``multihost``:
  ``train_on_hosts``, a real gloo run over them into a collector of its own.

The kit sits above ``collector.tools`` and never imports ``trainer`` or ``app``; nothing
in it imports pytest, so benchmarks and scripts use it as they are.
"""
