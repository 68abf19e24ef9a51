"""Layer 3, GGUF: a bounded header reader and the memory model of llama-server (pure)."""
