"""cgsvc: resolve, explain, audit and launch CUDA-graph plans for LLM inference."""

__version__ = "0.1.0"
