"""Helpers shared by the command-line subcommands (``mamba_edu.__main__``): the program name,
help formatting, and argument checks that turn bad input into usage errors (exit 2) before any
work starts.

Only the face imports this module (the command line, its command modules ``_cli_trace`` and
``grading.cli``, the demo and the benchmarks); the package never does (``tests/project/test_layering.py``).

Kept free of torch imports so that ``--version`` and ``--help`` of the top level stay cheap.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import textwrap
from pathlib import Path

NEUTRAL_PROG = "mamba-edu"
DEVICES = ("auto", "cpu", "cuda")
# The names of mamba_edu.model.config.PRESETS and mamba_edu.serving.STRATEGIES, for the options'
# choices: importing those packages imports torch, which would make every --help take seconds.
# tests/project/test_cli.py checks that they are the same.
PRESET_NAMES = ("tiny", "qwen3-next", "qwen3.5", "qwen3.5-tp8")
STRATEGY_NAMES = ("naive", "precomputed", "sync_free", "fused")


def prog_name() -> str:
    """How the user invoked us: ``python -m mamba_edu`` or ``mamba-edu`` (the console script).

    Anything else (a test runner calling ``main(argv)``, ``python -m mamba_edu.demo``) gets the
    neutral ``mamba-edu``: both spellings run the same code and accept the same arguments.
    """
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if argv0.name == "__main__.py" and argv0.parent.name == "mamba_edu":
        return "python -m mamba_edu"
    return NEUTRAL_PROG


def version() -> str:
    """The installed version of the package (falls back to ``mamba_edu.__version__``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mamba_edu")
    except PackageNotFoundError:
        import mamba_edu

        return mamba_edu.__version__


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show every option's default (flags excepted: theirs is just "off"; so are options whose
    help already words its default, and those without one), keep the description's line breaks
    as written (descriptions are wrapped by :func:`wrap` or come pre-wrapped)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0:  # --flag / --no-flag, -h, --version
            return action.help
        if action.default is None or "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)


def wrap(text: str, width: int = 88) -> str:
    """Paragraphs (separated by blank lines) filled to ``width`` for a raw description."""
    return "\n\n".join(textwrap.fill(" ".join(par.split()), width)
                       for par in text.strip().split("\n\n"))


_ROLE = re.compile(r":(?:func|mod|class|meth|data|attr):`~?([^`]+)`")


def plain(text: str | None) -> str:
    """A docstring made readable in a terminal: Sphinx roles, double backticks and bold marks
    removed."""
    if not text:
        return ""
    return _ROLE.sub(r"\1", text).replace("``", "").replace("**", "")


def _number(kind: type, least, strict: bool, what: str, most=None):
    """An argparse type: ``kind(value)`` that must be ``> least`` (strict) or ``>= least``, and
    at most ``most`` when given."""
    def parse(value: str):
        try:
            x = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
        if isinstance(x, float) and not math.isfinite(x):  # "nan" and "inf" parse; nan < 0 is False
            raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
        if x < least or (strict and x == least):
            raise argparse.ArgumentTypeError(f"must be {'above' if strict else 'at least'} {least}, got {value}")
        if most is not None and x > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {value}")
        return x
    parse.__name__ = what.replace(" ", "_")  # argparse names the type in its error messages
    return parse


positive_int = _number(int, 1, False, "a whole number")
non_negative_int = _number(int, 0, False, "a whole number")
positive_float = _number(float, 0, True, "a number")
seed_int = _number(int, 0, False, "a whole number", most=2**63 - 1)  # what torch's generators take
timeout_seconds = _number(int, 1, False, "a whole number of seconds", most=86_400)
# a judge that imports torch needs about 2.8 GiB of address space (JudgeLimits): less cannot start one
memory_gib = _number(float, 4, False, "a number of GiB", most=4096)
cpu_seconds = _number(int, 10, False, "a whole number of seconds", most=7 * 86_400)


def unwritable_reason(folder: Path) -> str | None:
    """Why ``folder`` cannot be created or written to, or ``None`` when it can.

    Checked before any work starts, so that an hour of measurements does not end in a
    ``PermissionError``. Only the nearest existing ancestor is inspected; nothing is created.
    """
    folder = Path(folder)
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} exists and is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def write_refusal(folder: Path) -> str | None:
    """Why no file can be written in ``folder`` (where it does not exist yet: in its nearest
    existing ancestor, where it would be created), or ``None``. Tried by writing and removing a
    probe file, nothing else created: permission bits alone do not tell (as root, under /proc)."""
    if why := unwritable_reason(folder):
        return why
    existing = Path(folder)
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    try:
        probe = existing / f".mamba_edu-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return f"cannot write there (a file in {existing}: {err.strerror or err})"
    return None


def check_out_dir(parser: argparse.ArgumentParser, folder: Path, option: str = "--out",
                  given: Path | None = None) -> None:
    """``parser.error`` (exit 2) unless ``folder`` can be created and written to (it is created
    now); the message names ``given`` (the option's value, default ``folder``)."""
    shown = folder if given is None else given
    if why := write_refusal(folder):
        parser.error(f"{option} {shown}: {why}")
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"{option} {shown}: cannot write there ({err.strerror or err})")


def resolve_device(parser: argparse.ArgumentParser, choice: str):
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; ``cuda`` without one is a usage
    error (exit 2) that says so."""
    import torch

    from mamba_edu._runtime import default_device

    if choice == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is visible to torch on this machine "
                     "(torch.cuda.is_available() is False); use --device cpu or auto")
    return default_device() if choice == "auto" else torch.device(choice)


def say(*args, **kwargs) -> None:
    """``print`` that flushes, so a piped or logged report keeps pace with the work."""
    print(*args, **kwargs, flush=True)
