"""Callbacks for training frameworks, each a few lines in the user's script (README, "Integrations"):
``collector.integrations.huggingface.RankscopeCallback`` for the ``transformers`` Trainer and
``collector.integrations.lightning.RankscopeCallback`` for Lightning. Each imports its framework,
which is an optional extra (``rankscope[huggingface]``, ``rankscope[lightning]``); the core never
imports this package."""
