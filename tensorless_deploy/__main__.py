"""python -m tensorless_deploy."""

import sys

from tensorless_deploy.cli import main

sys.exit(main())
