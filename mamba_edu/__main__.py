"""Command line: ``python -m mamba_edu {demo,bench,bench-kernels,grade} [options]``."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": ("mamba_edu.demo", "the main job on the default device: a short readable report"),
    "bench": ("mamba_edu.benchmarks.ttft", "TTFT, bubbles and syncs per tracking strategy"),
    "bench-kernels": ("mamba_edu.benchmarks.kernels", "our Triton prefill/decode vs fla on a GPU"),
    "grade": ("mamba_edu.exercises.grader", "execute submitted notebooks and grade their exercises"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m mamba_edu", description=__doc__)
    parser.add_argument("command", choices=sorted(COMMANDS),
                        help="; ".join(f"{k}: {v[1]}" for k, v in COMMANDS.items()))
    args, rest = parser.parse_known_args(argv[:1])
    module = importlib.import_module(COMMANDS[args.command][0])
    return module.main(argv[1:] + rest) or 0


if __name__ == "__main__":
    sys.exit(main())
