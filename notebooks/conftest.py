"""nbmake runs the notebooks here as they are; results.ipynb needs runs, so tests/engine/test_notebooks.py runs it on
runs that test makes (a fit, a sweep, a multirun)."""

collect_ignore = ["results.ipynb"]
