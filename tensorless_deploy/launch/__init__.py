"""Layer 5, the launch spec: one value per container, rendered to unit files and argv (pure)."""
