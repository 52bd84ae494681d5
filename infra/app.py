"""The cdktf entry point, kept for `cdktf.json` (`python -m infra.app`) and users' scripts: it runs
`infra.cdk.app.main`, where the app (`build_app`, `selected_environments`) lives.
"""

from __future__ import annotations

import sys

from infra.cdk.app import main

if __name__ == "__main__":
    sys.exit(main())
