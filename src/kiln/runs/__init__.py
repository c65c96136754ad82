"""The run folder as data: its layout and status, its provenance, its summary and pictures."""
