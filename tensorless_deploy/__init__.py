"""tensorless-deploy: pinned llama-server recipes, served on GPU hosts over SSH."""

__version__ = "0.1.0"
