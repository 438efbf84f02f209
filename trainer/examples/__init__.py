"""Runnable examples of the bundled engine: ``python -m trainer.examples.gpt`` /
``trainer.examples.bert`` with a ds_config from ``configs/`` (tiny models, synthetic data)."""
