"""Layer 5: pyinfra facts, operations and the @deploy that serves a recipe on a host."""
