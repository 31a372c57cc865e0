"""``python -m jaxwise.watch [options] SCRIPT [ARGS...]``: the same as ``jaxwise watch``."""

import sys

from jaxwise.cli import main

if __name__ == "__main__":
    sys.exit(main(["watch", *sys.argv[1:]]))
