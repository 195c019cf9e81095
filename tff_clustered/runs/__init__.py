"""One run: its parameters (RunSpec), the runner and the Python API, its checkpoints."""
