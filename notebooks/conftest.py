"""The notebooks run in tests that read what they show: tests/test_quickstart.py runs the quickstart and checks its
pictures; results.ipynb needs runs, so tests/engine/test_notebooks.py runs it on runs that test makes (a fit, a
sweep, a multirun). nbmake, which checks only that a notebook ends without an error, runs none of them twice."""

collect_ignore = ["quickstart.ipynb", "results.ipynb"]
