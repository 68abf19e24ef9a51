"""Layer 7, operations: pyinfra operations and the @deploy that serve a model on a host."""
