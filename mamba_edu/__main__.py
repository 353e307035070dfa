"""Command line of mamba_edu: ``mamba-edu COMMAND [options]``, the same as
``python -m mamba_edu COMMAND [options]``.

Exit status: 0 = everything ran and every check passed; 1 = a check or a measurement failed;
2 = a usage error, or nothing could run here (the message says why, e.g. bench-kernels without
a GPU); 130 = interrupted (Ctrl-C); 141 = the reader of the output went away (``| head``).

``--version`` and ``--help`` import no command module and no torch: only the command that runs is
imported, when it runs.
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):  # before any import that would fail with a less clear message
    sys.exit(f"mamba_edu needs Python >= 3.11; this is {sys.version.split()[0]} "
             "(docs/install.md: make setup PYTHON=python3.11)")

import argparse  # noqa: E402
import importlib  # noqa: E402

from mamba_edu._cli import HelpFormatter, plain, prog_name, version, wrap  # noqa: E402

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
    "bench-buckets": ("mamba_edu.benchmarks.buckets",
                      "fresh-batch prefill: eager vs a captured token bucket in each capture mode "
                      "(needs a GPU)"),
    "bench-host": ("mamba_edu.benchmarks.host",
                   "host cost of one eager prefill per strategy, the CUDA path emulated on a CPU: "
                   "Triton launches, torch ops, Python calls per GPU kernel"),
    "grade": ("mamba_edu.grading.cli", "execute submitted notebooks and grade their exercises"),
    "trace": ("mamba_edu._cli_trace",
              "bubble summary and PNG timeline of any torch.profiler trace, offline"),
}
PASSTHROUGH = ("bench-kernels", "bench-buckets", "grade")  # their own parsers read the rest of the line

EPILOG = wrap("""
Run 'COMMAND --help' for a command's options and defaults. Exit status: 0 ok; 1 a check or a
measurement failed; 2 usage error or nothing runnable here; 130 interrupted.

Examples: demo --device cpu; bench --cases launch_bound_1x512 --quick;
trace data/runs/launch_bound_1x512/naive.pt.trace.json.gz; grade path/to/notebooks/
""")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser: the commands listed with their summaries, ``--version``. Cheap: no
    command module is imported (each command's own parser is :func:`command_parser`)."""
    prog = prog or prog_name()
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=HelpFormatter, epilog=EPILOG,
        description=wrap("A notebook course and package: prefilling a hybrid Gated DeltaNet model "
                         "and tracking its recurrent states for the prefix cache."))
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {version()} (torch {_dist_version('torch')}, "
                                f"triton {_triton_version()})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (_, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return parser


def command_parser(name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of one command (demo, bench, trace): its module is imported here."""
    module = importlib.import_module(COMMANDS[name][0])
    description = getattr(module, "DESCRIPTION", None)
    parser = argparse.ArgumentParser(
        prog=f"{prog or prog_name()} {name}", formatter_class=HelpFormatter,
        description=wrap(description) if description else plain(module.__doc__))
    module.add_arguments(parser)
    parser.set_defaults(check=module.check_args, run=module.run, parser=parser)
    return parser


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version(name)
    except PackageNotFoundError:
        return "not installed"


def _triton_version() -> str:
    from mamba_edu._runtime import triton_available

    return _dist_version("triton") if triton_available() else "not installed"


class _StyledArgparse:
    """``argparse`` as a passthrough command's module sees it: its parser gets our program name
    and our help style (every default shown), whatever the module wrote."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr != "ArgumentParser":
            return getattr(argparse, attr)
        name = self._name

        def styled(*args, **kwargs):
            kwargs["prog"] = f"{prog_name()} {name}"
            kwargs["formatter_class"] = HelpFormatter
            return argparse.ArgumentParser(*args, **kwargs)
        return styled


def passthrough(name: str, rest: list[str]) -> int:
    """Hand ``rest`` to a command that parses its own arguments (bench-kernels, grade)."""
    wants_help = any(a in ("-h", "--help") for a in rest)
    if name in ("bench-kernels", "bench-buckets") and not wants_help:
        import torch

        if not torch.cuda.is_available():
            what = "Triton kernels" if name == "bench-kernels" else "CUDA-graph replays"
            print(f"{prog_name()} {name}: nothing to run here: it times {what} on a CUDA GPU and "
                  "torch sees none on this machine (bench runs on a CPU)", file=sys.stderr)
            return 2
    module = importlib.import_module(COMMANDS[name][0])
    if getattr(module, "argparse", None) is argparse:
        from mamba_edu._runtime import overriding

        with overriding(vars(module), "argparse", _StyledArgparse(name)):
            return module.main(rest) or 0
    return module.main(rest) or 0


def _main(argv: list[str]) -> int:
    if argv and argv[0] in PASSTHROUGH:
        return passthrough(argv[0], argv[1:])
    if argv and argv[0] in COMMANDS:
        parser = command_parser(argv[0])
        args = parser.parse_args(argv[1:])
        return args.run(args.check(args.parser, args)) or 0
    parser = build_parser()
    args = parser.parse_args(argv)  # --help, --version, an unknown command: all end here
    parser.print_help(sys.stderr)
    print(f"\n{parser.prog}: error: no COMMAND given", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(f"\n{prog_name()}: interrupted (Ctrl-C); partial results, if any, stay where they "
              "were written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """The reader of stdout went away (``... | head``): end quietly, as ``cat`` does, with 141
    (128 + SIGPIPE). stdout is pointed at /dev/null first, so that Python's flush at exit does
    not raise the same error again."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


if __name__ == "__main__":
    sys.exit(main())
