"""The process: stop signals, DDP process groups, secrets and the project's .env."""
