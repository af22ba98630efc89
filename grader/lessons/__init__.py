"""One module per lesson: its hidden reference functions, seeded cases and known mistakes (traps).

``lNN_topic.py`` holds lesson ``NN_topic``'s reference functions and an ``EXERCISES`` dict of
:class:`grader.harness.Exercise`; ``grader.registry`` collects them, so ``grader.check`` finds
each exercise by its function's name. Builders the lessons share are in ``_common.py``.
"""
