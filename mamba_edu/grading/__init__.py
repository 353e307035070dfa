"""Grading submitted notebooks: the grader and its judge processes, the containment around them,
a class's grade book, and the ``grade`` command. The checks themselves live in
:mod:`mamba_edu.exercises`; nothing here holds an answer."""
