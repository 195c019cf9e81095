"""The round: its parts as TF functions, composed once, run by an execution; the aggregators."""
