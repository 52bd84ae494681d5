"""`python -m jobs.serve_smoke` (`make serve-smoke`): see `jobs.serve.smoke`."""

import sys

from jobs.serve.smoke import main

if __name__ == "__main__":
    sys.exit(main())
