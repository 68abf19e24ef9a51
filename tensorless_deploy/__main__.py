"""python -m tensorless_deploy."""

from tensorless_deploy.cli import entry

entry()
