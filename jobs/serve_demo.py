"""`python -m jobs.serve_demo` (`make serve-demo`): see `jobs.serve.demo`."""

import sys

from jobs.serve.demo import main

if __name__ == "__main__":
    sys.exit(main())
