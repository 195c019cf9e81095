"""The training loop: a run's state, its rounds, their evaluation and privacy account."""
