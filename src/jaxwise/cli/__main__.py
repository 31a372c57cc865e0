"""``python -m jaxwise.cli [command] ...``: the same as the ``jaxwise`` command."""

import sys

from jaxwise.cli import main

if __name__ == "__main__":
    sys.exit(main())
