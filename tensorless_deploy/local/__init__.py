"""Layer 8, this machine: its facts, the model in its Hub cache, a foreground run, bench."""
