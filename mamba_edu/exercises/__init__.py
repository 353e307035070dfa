"""The course's exercises: one module of checks per notebook (``nb01`` for ``01_…``).

Each check takes the learner's function(s), runs them on fresh inputs and prints one line:
``exercise N: PASS — …``, ``exercise N: FAIL — …`` or ``exercise N: not done yet``. The
answers are not in the package: they live in ``notebooks/solutions/`` (see ``docs/teaching.md``).
``python -m mamba_edu grade PATH`` runs a submission and grades every exercise.
"""

from mamba_edu.exercises import core, nb00, nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb08, nb09, nb12

__all__ = ["core", "nb00", "nb01", "nb02", "nb03", "nb04", "nb05", "nb06", "nb07", "nb08", "nb09", "nb12"]
