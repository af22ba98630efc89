"""A simulated class: submissions built from the student notebooks and solution sources.

``spec.cases()`` lists every simulated submission with what grading it must
give (which checks fail, the status, the diagnoses, the flags);
``spec.materialize()`` writes them where nbgrader expects submissions.
"""
