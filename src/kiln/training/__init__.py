"""What runs inside the Trainer besides the callbacks: LR schedules."""
