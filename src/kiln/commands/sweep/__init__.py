"""Many runs from one command: Optuna sweeps whose trials are real ``kiln fit`` runs."""
