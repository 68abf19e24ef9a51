"""Layer 4, decisions: the operator's options resolved once, and the checks of a host."""
