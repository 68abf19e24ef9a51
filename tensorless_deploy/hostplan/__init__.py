"""Layer 6, the host plan: what one host serves and why, from decisions and the launch spec."""
