"""References and exercises of the lessons beyond one head (08 onwards).

Each module here (``l08_multihead.py``, ...) defines its reference functions and
an ``EXERCISES`` dict of :class:`grader.harness.Exercise`; ``grader.registry``
collects them, so ``grader.check`` finds them by name.
"""
