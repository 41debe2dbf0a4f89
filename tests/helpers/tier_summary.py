"""Lines an engine tier's tests add (grid sizes, counts per backend), printed at the end of the tier's run.

A module of its own so that the tests and the tier's conftest share one list: a conftest is
imported by pytest under a name of its own and must not be imported again by name.
"""

LINES: list[str] = []
