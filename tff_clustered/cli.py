"""What every binary does with its command line before any work: absl's parser, with bad
input as exit code 2. Light (absl only), so a binary can use it before TensorFlow is imported."""

from __future__ import annotations

import math
import sys

from absl import flags

FLAGS = flags.FLAGS


def parse_flags(argv: list[str]) -> list[str]:
    """`app.run`'s flags parser: a value absl itself rejects (not a number, out of its bounds,
    not among an enum's choices, an unknown flag) exits 2 like every other bad input, with
    absl's message naming the flag (absl's own parser exits 1), and so does a non-finite
    number (absl reads `nan` and `inf` as floats); asking for help exits 0."""
    try:
        rest = FLAGS(argv)
    except SystemExit as e:  # absl's --help/--helpfull/--helpshort print the help and exit 1
        asked = {"--help", "--helpfull", "--helpshort", "-h", "-?"} & set(argv[1:])
        raise SystemExit(0 if asked and e.code == 1 else e.code) from None
    except flags.Error as e:
        print(f"error: {e}\nPass --helpshort or --helpfull to see the flags.", file=sys.stderr)
        raise SystemExit(2) from None
    for name in FLAGS:
        value = FLAGS[name].value
        if FLAGS[name].present and isinstance(value, float) and not math.isfinite(value):
            print(f"error: --{name}={value}: give a finite number", file=sys.stderr)
            raise SystemExit(2)
    return rest


def usage_error(message: str) -> SystemExit:
    """`error: message` on stderr; raise the returned exit (code 2)."""
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(2)
