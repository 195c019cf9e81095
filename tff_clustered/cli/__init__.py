"""The command line: the binaries' code, their flags, their exits and their logs (the top layer)."""
