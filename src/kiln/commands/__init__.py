"""kiln's commands: the one boundary every command ends through, and each subcommand's own module."""
