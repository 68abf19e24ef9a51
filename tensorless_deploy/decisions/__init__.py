"""Layer 3, decisions: pure verdicts from a recipe, host facts and resolved operator options."""
