"""W&B: its mode chosen before it starts, its offline run file read back, checkpoints as its artifacts."""
