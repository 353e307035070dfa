"""Make the learner's notebooks from the solution notebooks: solution blocks become stubs.

``notebooks/solutions/NN_name.ipynb`` is the source; ``notebooks/NN_name.ipynb`` is generated.
In a solution notebook's code cell, a block ::

        ### BEGIN SOLUTION hint: start from the cumulative sum of g
        ...your answer...
        ### END SOLUTION

becomes, in the learner's notebook, one line at the marker's indentation ::

        raise NotImplementedError("hint: start from the cumulative sum of g")

Run ``python -m mamba_edu.exercises.stubs`` (``make notebooks``) after editing a solution
notebook; ``--execute`` also runs both versions and stores their outputs.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\s*(?P<hint>.*?)\s*$")
END = re.compile(r"^[ \t]*### END SOLUTION\s*$")
DEFAULT_HINT = "replace this line with your code"


def strip_solutions(source: str) -> str:
    """Replace every solution block of a cell's ``source`` by a ``NotImplementedError`` stub.

    Raises ``ValueError`` on a block that is not closed or an ``END`` without a ``BEGIN``.
    """
    out, inside = [], False
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise ValueError(f"line {number}: BEGIN SOLUTION inside another solution block")
            inside = True
            hint = begin["hint"] or DEFAULT_HINT
            out.append(f'{begin["indent"]}raise NotImplementedError({hint!r})\n')
        elif END.match(line):
            if not inside:
                raise ValueError(f"line {number}: END SOLUTION without BEGIN SOLUTION")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("a BEGIN SOLUTION block is not closed by END SOLUTION")
    return "".join(out).rstrip("\n")


def has_solution(source: str) -> bool:
    """True if ``source`` holds a solution marker."""
    return any(BEGIN.match(line) or END.match(line) for line in source.splitlines())


def learner_notebook(solution):
    """The learner's version of a solution notebook (an ``nbformat`` node): stubs in place of
    solutions; the outputs of changed cells are cleared."""
    import nbformat

    nb = nbformat.from_dict(solution)
    for cell in nb.cells:
        if cell.cell_type == "code" and has_solution(cell.source):
            cell.source = strip_solutions(cell.source)
            cell.outputs, cell.execution_count = [], None
    return nb


def execute(path: Path, timeout: int = 1200) -> None:
    """Run a notebook top to bottom in its own folder and store its outputs in place."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mamba_edu.exercises.stubs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebooks", type=Path, default=Path("notebooks"),
                        help="folder of the learner notebooks; solutions are in its solutions/ (default: %(default)s)")
    parser.add_argument("--execute", action="store_true", help="also execute both versions and store outputs")
    parser.add_argument("only", nargs="*", help="notebook file names to process (default: all)")
    args = parser.parse_args(argv)
    import nbformat

    sources = sorted((args.notebooks / "solutions").glob("*.ipynb"))
    if args.only:
        sources = [p for p in sources if p.name in args.only or p.stem in args.only]
    if not sources:
        print(f"no solution notebooks under {args.notebooks / 'solutions'}", file=sys.stderr)
        return 2
    for source in sources:
        target = args.notebooks / source.name
        nbformat.write(learner_notebook(nbformat.read(source, as_version=4)), target)
        print(f"wrote {target}", flush=True)
        if args.execute:
            for path in (source, target):
                start = time.perf_counter()
                execute(path)
                print(f"executed {path} in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
