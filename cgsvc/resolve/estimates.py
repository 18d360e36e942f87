"""Capture estimates for a resolved plan. The formulas are documented in docs/estimates.md.

    pieces(prefill)  = num_layers + 1 for breakable and tc_piecewise (graph segments between
                       the attention breaks), 1 for full, 0 for disabled
    graphs           = pieces(prefill) x len(prefill.num_tokens) + len(decode.bs)
    pool(phase)      = max_size x hidden_size x ACTIVATION_BYTES_PER_HIDDEN
    capture_memory   = pool(prefill) + pool(decode) + graphs x GRAPH_OVERHEAD_BYTES
    capture_seconds  = graphs(prefill) x PREFILL_PIECE_SECONDS
                       + len(decode.bs) x num_layers x DECODE_LAYER_SECONDS
                       + (TC_COMPILE_SECONDS if prefill is tc_piecewise)
"""

from __future__ import annotations

from cgsvc.plan import Estimates
from cgsvc.resolve.engine import Context

# Graphs of one phase share one memory pool; the pool holds the largest graph's live
# activations: about 8 hidden-size bf16 tensors per token (residual, norms, attention
# input/output, MLP in/out) = 16 bytes per hidden unit per token.
ACTIVATION_BYTES_PER_HIDDEN = 16
GRAPH_OVERHEAD_BYTES = 256 * 1024  # executable graph objects and their kernel parameters
PREFILL_PIECE_SECONDS = 0.004
DECODE_LAYER_SECONDS = 0.0005
TC_COMPILE_SECONDS = 30.0


def estimate(ctx: Context) -> Estimates:
    layers, hidden = max(ctx.model.num_layers, 1), max(ctx.model.hidden_size, 1)
    prefill: str = ctx.prefill
    p_sizes: tuple[int, ...] = tuple(ctx["prefill.num_tokens"] or ()) if prefill != "disabled" else ()
    d_sizes: tuple[int, ...] = tuple(ctx["decode.bs"] or ()) if ctx.decode != "disabled" else ()
    pieces = {"breakable": layers + 1, "tc_piecewise": layers + 1, "full": 1}.get(prefill, 0)
    prefill_graphs = pieces * len(p_sizes)
    graphs = prefill_graphs + len(d_sizes)
    pool = (max(p_sizes, default=0) + max(d_sizes, default=0)) * hidden * ACTIVATION_BYTES_PER_HIDDEN
    seconds = (prefill_graphs * PREFILL_PIECE_SECONDS + len(d_sizes) * layers * DECODE_LAYER_SECONDS
               + (TC_COMPILE_SECONDS if prefill == "tc_piecewise" and p_sizes else 0.0))
    return Estimates(graphs=graphs, capture_memory_bytes=pool + graphs * GRAPH_OVERHEAD_BYTES,
                     capture_seconds=round(seconds, 3))
