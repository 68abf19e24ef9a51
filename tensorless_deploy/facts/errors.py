"""The error a host fact raises when a host's output cannot be read at all."""

from __future__ import annotations

from tensorless_deploy.errors import TensorlessError


class FactError(TensorlessError):
    """Output from a host that no parser can make sense of (or inventory data that is wrong)."""
