"""Run the corpus on one engine, in every rank of a torchrun job:

    torchrun --nproc_per_node 2 run_corpus.py --engine deepspeed --out DIR [SCRIPT ...]

Each script is a DeepSpeed script, run as ``__main__`` with its own command line. With
``--engine rankscope`` its one ``import deepspeed`` line becomes ``import trainer as
deepspeed`` -- the one-line change the README tells users to make -- and nothing else is
touched. The scripts run one after the other in the same process group (a script's own
``init_distributed`` finds it already joined), so each engine pays its start-up once.
A script that raises is written to ``DIR/<script>.rank<R>.error`` and the next one runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMPORT_LINE = "\nimport deepspeed\n"
SWAPPED_LINE = "\nimport trainer as deepspeed\n"

# script -> its command line after --out (paths relative to this folder are resolved)
SCRIPTS = {
    "client_optimizer.py": [],
    "callable_optimizer.py": [],
    "client_scheduler.py": [],
    "callable_scheduler.py": [],
    "args_config.py": ["--deepspeed", "--deepspeed_config", str(HERE / "ds_config.json")],
    "config_params.py": [],
    "grad_accumulation.py": [],
    "tagged_checkpoints.py": [],
    "seed002_getting_started.py": [],
    "seed001_examples.py": [],
    "pipeline_module.py": [],
}


def source_for(script: Path, engine: str) -> str:
    """The script's source as that engine runs it."""
    source = script.read_text()
    if engine == "rankscope":
        if source.count(IMPORT_LINE) != 1:
            raise ValueError(f"{script.name}: expected exactly one 'import deepspeed' line")
        source = source.replace(IMPORT_LINE, SWAPPED_LINE)
    return source


def run_script(script: Path, engine: str, out: str) -> None:
    code = compile(source_for(script, engine), str(script), "exec")
    argv = sys.argv
    sys.argv = [str(script), "--out", out, *SCRIPTS[script.name]]
    try:
        exec(code, {"__name__": "__main__", "__file__": str(script)})
    finally:
        sys.argv = argv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("deepspeed", "rankscope"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("scripts", nargs="*", default=list(SCRIPTS))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))  # the scripts import _corpus
    if args.engine == "deepspeed":
        import logging

        import deepspeed

        deepspeed.utils.logger.setLevel(logging.WARNING)
    import torch

    torch.set_num_threads(1)
    rank = os.environ.get("RANK", "0")
    for name in args.scripts:
        try:
            run_script(HERE / name, args.engine, args.out)
        except BaseException:
            os.makedirs(args.out, exist_ok=True)
            Path(args.out, f"{Path(name).stem}.rank{rank}.error").write_text(traceback.format_exc())
            raise


if __name__ == "__main__":
    main()
