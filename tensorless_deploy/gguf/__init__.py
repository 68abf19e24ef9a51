"""Layer 2, GGUF: a bounded header reader and the memory model of llama-server (pure)."""
