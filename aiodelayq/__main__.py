"""``python -m aiodelayq``: the command line (needs the ``cli`` extra; see :mod:`aiodelayq.cli`)."""

from aiodelayq.cli import main

if __name__ == "__main__":
    main()
