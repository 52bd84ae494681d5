"""`python -m jobs.serve`: see `jobs.serve.app`."""

import sys

from jobs.serve.app import main

if __name__ == "__main__":
    sys.exit(main())
