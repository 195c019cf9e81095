"""TFF's runtime and the process's lifetime: the execution context, the workers and signals."""
