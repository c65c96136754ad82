"""What runs inside the Trainer besides the callbacks: checkpoint files, loggers, LR schedules, the test after fit."""
