"""Your research: the data, networks and LightningModules that kiln's engine trains (cookiecutter renames it)."""
