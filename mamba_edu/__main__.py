"""Command line of mamba_edu: ``mamba-edu COMMAND [options]``, the same as
``python -m mamba_edu COMMAND [options]``.

Exit status: 0 = everything ran and every check passed; 1 = a check or a measurement failed;
2 = a usage error, or nothing could run here (the message says why, e.g. bench-kernels without
a GPU).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mamba_edu._cli import HelpFormatter, prog_name, version, wrap

# name -> (module, one-line summary). demo, bench and trace define their options in their module
# (add_arguments / check_args / run); bench-kernels and grade keep their own parsers and get the
# rest of the command line as it is.
COMMANDS = {
    "demo": ("mamba_edu.demo",
             "the main job on the default device: GDN math checked, the four tracking strategies "
             "side by side, a timeline figure"),
    "bench": ("mamba_edu.benchmarks.ttft", "TTFT, bubbles and syncs per tracking strategy"),
    "bench-kernels": ("mamba_edu.benchmarks.kernels",
                      "our Triton prefill/decode kernels vs flash-linear-attention (needs a GPU)"),
    "grade": ("mamba_edu._cli_grade", "execute submitted notebooks and grade their exercises"),
    "trace": ("mamba_edu._cli_trace",
              "bubble summary and PNG timeline of any torch.profiler trace, offline"),
}
PASSTHROUGH = ("bench-kernels", "grade")  # their own parsers read the rest of the line

EPILOG = wrap("""
Run 'COMMAND --help' for a command's options and defaults. Exit status: 0 ok; 1 a check or a
measurement failed; 2 usage error or nothing runnable here.

Examples: demo --device cpu; bench --cases launch_bound_1x512 --quick;
trace data/runs/launch_bound_1x512/naive.pt.trace.json.gz; grade path/to/notebooks/
""")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    prog = prog or prog_name()
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=HelpFormatter, epilog=EPILOG,
        description=wrap("A notebook course and package: prefilling a hybrid Gated DeltaNet model "
                         "and tracking its recurrent states for the prefix cache."))
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {version()} (torch {_dist_version('torch')})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (module_name, summary) in COMMANDS.items():
        if name in PASSTHROUGH:  # listed for --help; main() hands their arguments over unparsed
            sub.add_parser(name, help=summary, add_help=False)
            continue
        module = importlib.import_module(module_name)
        description = getattr(module, "DESCRIPTION", None)
        command = sub.add_parser(
            name, help=summary, formatter_class=HelpFormatter,
            description=wrap(description) if description else _plain_doc(module))
        module.add_arguments(command)
        command.set_defaults(check=module.check_args, run=module.run, parser=command)
    return parser


def _plain_doc(module) -> str:
    from mamba_edu._cli import plain

    return plain(module.__doc__)


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version(name)
    except PackageNotFoundError:
        return "not installed"


def passthrough(name: str, rest: list[str]) -> int:
    """Hand ``rest`` to a command that parses its own arguments (bench-kernels, grade)."""
    wants_help = any(a in ("-h", "--help") for a in rest)
    if name == "bench-kernels" and not wants_help:
        import torch

        if not torch.cuda.is_available():
            print(f"{prog_name()} bench-kernels: nothing to run here: it times Triton kernels on a "
                  "CUDA GPU and torch sees none on this machine (bench runs on a CPU)",
                  file=sys.stderr)
            return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest) or 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        return passthrough(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        print(f"\n{parser.prog}: error: no COMMAND given", file=sys.stderr)
        return 2
    return args.run(args.check(args.parser, args)) or 0


if __name__ == "__main__":
    sys.exit(main())
