"""The project's one small exception tree; the CLI renders each as one line plus its fix."""

from __future__ import annotations


class TensorlessError(Exception):
    """An error the operator can act on: a message, and where known the fix."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def lines(self) -> list[str]:
        """What the CLI prints, one problem a line."""
        return [self.message if not self.fix else f"{self.message} (fix: {self.fix})"]


class UsageError(TensorlessError):
    """The command line itself is wrong."""

    exit_code = 2


class RecipeError(TensorlessError):
    """One or more recipes were refused; every problem is kept, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems[0] if problems else "recipe refused")
        self.problems = problems

    def lines(self) -> list[str]:
        return list(self.problems)


class UnknownModelError(TensorlessError):
    """MODEL matched no recipe; carries the closest names. A usage error: what was typed."""

    exit_code = 2

    def __init__(self, model: str, suggestions: list[str]) -> None:
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(
            f"{model}: no recipe for this model{hint}",
            fix="run 'tensorless-deploy models' to list the catalog",
        )
        self.suggestions = suggestions


class InventoryError(TensorlessError):
    """An inventory that cannot be read, or host data of the wrong shape."""
