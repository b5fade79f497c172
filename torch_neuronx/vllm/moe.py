"""Unquantized mixture-of-experts for vLLM on ``neuron`` (Qwen3-MoE, GPT-OSS, ...), in torch ops.

vLLM hands out-of-tree platforms an unquantized MoE method with no kernel behind it; this module
registers the replacement (vLLM's ``CustomOp.register_oot``). vLLM's router has already chosen
each token's experts and weights; here each selected expert runs its gated MLP on the tokens
routed to it, and the results are summed with the router weights. With expert parallelism the
layer's ``expert_map`` sends experts owned by other ranks to -1 (skipped); the runner reduces the
partial sums across ranks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.fused_moe.activation import ApplyMoEActivationConfig, MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod


# GPT-OSS's SwiGLU constants, fixed in its checkpoints' activation (vLLM's swigluoai_and_mul)
SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT = 1.702, 7.0


def _activation(kind: MoEActivation, h: torch.Tensor, cfg: ApplyMoEActivationConfig) -> torch.Tensor:
    if kind == MoEActivation.SWIGLUOAI:
        gate, up = h[..., ::2], h[..., 1::2]  # interleaved in gpt-oss checkpoints
        gate = gate.clamp(max=SWIGLUOAI_LIMIT)
        up = up.clamp(-SWIGLUOAI_LIMIT, SWIGLUOAI_LIMIT)
        return gate * torch.sigmoid(gate * SWIGLUOAI_ALPHA) * (up + 1)
    gated = {MoEActivation.SILU: F.silu, MoEActivation.GELU: F.gelu,
             MoEActivation.GELU_TANH: lambda t: F.gelu(t, approximate="tanh")}
    if kind in gated and cfg.clamp_limit is None:
        gate, up = h.chunk(2, dim=-1)
        return gated[kind](gate) * up
    plain = {MoEActivation.SILU_NO_MUL: F.silu, MoEActivation.GELU_NO_MUL: F.gelu,
             MoEActivation.GELU_TANH_NO_MUL: lambda t: F.gelu(t, approximate="tanh"),
             MoEActivation.RELU2_NO_MUL: lambda t: F.relu(t).square()}
    if kind in plain:
        return plain[kind](h)
    raise NotImplementedError(f"MoE activation {kind.value} (clamp {cfg.clamp_limit}) is not supported on neuron")


@CustomOp.register_oot(name="UnquantizedFusedMoEMethod")
class NeuronUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    @property
    def is_monolithic(self) -> bool:
        return False  # vLLM's router selects the experts; apply() gets ids and weights

    def forward_oot(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    shared_experts=None, shared_experts_input=None) -> torch.Tensor:
        if shared_experts is not None:
            raise NotImplementedError("MoE layers with fused shared experts are not supported on neuron yet")
        if layer.apply_router_weight_on_input:
            raise NotImplementedError("router weights applied on the MoE input are not supported on neuron yet")
        cfg = ApplyMoEActivationConfig.from_configs(layer.moe_config, self.get_fused_moe_quant_config(layer))
        kind = MoEActivation(layer.activation) if not isinstance(layer.activation, MoEActivation) else layer.activation
        num_tokens, k = topk_ids.shape
        ids = topk_ids.to(torch.long).reshape(-1)
        if layer.expert_map is not None:  # global expert id -> this rank's, -1 when elsewhere
            ids = layer.expert_map.to(torch.long)[ids]
        weights = topk_weights.reshape(-1, 1).float()
        token_of = torch.arange(num_tokens, device=x.device).repeat_interleave(k)
        w13, w2 = layer.w13_weight, layer.w2_weight
        b13, b2 = getattr(layer, "w13_bias", None), getattr(layer, "w2_bias", None)
        out = torch.zeros(num_tokens, w2.shape[1], dtype=torch.float32, device=x.device)
        for e in ids.unique().tolist():
            if e < 0:
                continue
            sel = (ids == e).nonzero().squeeze(1)
            toks = token_of[sel]
            h = F.linear(x[toks], w13[e], None if b13 is None else b13[e])
            y = F.linear(_activation(kind, h, cfg), w2[e], None if b2 is None else b2[e])
            out.index_add_(0, toks, y.float() * weights[sel])
        return out.to(x.dtype)

    forward_native = forward_oot


def _topk_routing(scores: torch.Tensor, topk_weights, topk_ids, token_expert_indices, renormalize, bias):
    choice = scores if bias is None else scores + bias.float()
    ids = choice.topk(topk_ids.shape[1], dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    topk_weights.copy_(weights)
    topk_ids.copy_(ids)
    n, k = ids.shape
    # slot j of token t is row j * n + t of the expanded token list (vLLM's convention)
    token_expert_indices.copy_(torch.arange(k, device=ids.device)[None, :] * n
                               + torch.arange(n, device=ids.device)[:, None])


def _topk_softmax(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize, bias=None,
                  is_padding=None) -> None:
    _topk_routing(torch.softmax(gating_output.float(), dim=-1), topk_weights, topk_ids,
                  token_expert_indices, renormalize, bias)


def _topk_sigmoid(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize, bias=None,
                  is_padding=None) -> None:
    _topk_routing(torch.sigmoid(gating_output.float()), topk_weights, topk_ids,
                  token_expert_indices, renormalize, bias)


def _register_router_ops() -> None:
    """vLLM's top-k router calls ``torch.ops._moe_C.topk_softmax`` / ``topk_sigmoid``, which live
    in its compiled kernels (never loaded on neuron); define them here in torch ops."""
    if hasattr(torch.ops._moe_C, "topk_softmax"):
        return
    lib = torch.library.Library("_moe_C", "FRAGMENT")
    for name, fn in (("topk_softmax", _topk_softmax), ("topk_sigmoid", _topk_sigmoid)):
        lib.define(f"{name}(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor(c!) token_expert_indices, "
                   "Tensor gating_output, bool renormalize, Tensor? bias=None, Tensor? is_padding=None) -> ()")
        lib.impl(name, fn, "CompositeExplicitAutograd")
    _register_router_ops.lib = lib  # the registrations live as long as the library object


_register_router_ops()
