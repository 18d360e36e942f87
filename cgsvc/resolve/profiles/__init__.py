"""Engine profiles: other engines' CUDA-graph argument handling as rule tables (docs/policies.md)."""
