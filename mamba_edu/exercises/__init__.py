"""Reference answers to the notebook exercises, and the checks the notebooks run on yours.

One module per notebook (``nb01`` for ``01_…``). Each exercise has an answer function and a
``check_…`` function that takes *your* function, runs it on fresh inputs and prints a PASS line
(or raises ``AssertionError`` saying what differs).
"""
