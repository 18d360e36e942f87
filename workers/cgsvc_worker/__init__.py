"""cgsvc's data plane: a tensor-parallel DeepSeek-V3-architecture (MLA) worker.

model.py (the model), layers.py (TP linear layers, YaRN rotary), loader.py (sharded
safetensors), kv_cache.py (paged latent cache), attention.py (backends), graphs.py (graph
modes), engine.py (prefill/decode steps), driver.py (workloads and reports), cli.py.
The only part of cgsvc that imports torch.
"""
