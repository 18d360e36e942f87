"""Hugging Face transformers as the numeric reference (a test dependency only)."""

from __future__ import annotations

import torch
from transformers import DeepseekV3ForCausalLM


def hf_model(path: str, dtype: torch.dtype) -> DeepseekV3ForCausalLM:
    return DeepseekV3ForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()


@torch.no_grad()
def hf_greedy(model: DeepseekV3ForCausalLM, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the logits that chose each, by full forwards (no cache to trust)."""
    toks, logits = list(prompt), []
    for _ in range(steps):
        lg = model(torch.tensor([toks])).logits[0, -1].float()
        logits.append(lg)
        toks.append(int(lg.argmax()))
    return toks[len(prompt):], logits


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ||a - b|| / ||b|| (L2 over the vocabulary)."""
    return float((a.float() - b.float()).norm() / b.float().norm())


def max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """The stricter max-abs form, max|a - b| / max|b|."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())
