"""A run's outputs: its CSV, JSON and TensorBoard files, and its pictures."""
