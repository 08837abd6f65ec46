"""Gated MLPs and DeepSeek-V3's mixture of experts, written against the ops interface."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import MoEConfig


@dataclass
class GatedMLP:
    w_gate: object
    w_up: object
    w_down: object

    def __call__(self, ops, x):
        gate, up = ops.linears(x, [self.w_gate, self.w_up])
        return ops.silu_mul_linear(gate, up, self.w_down)


@dataclass
class MoE:
    config: MoEConfig
    router: object              # [n_routed_experts, hidden]
    score_bias: object          # e_score_correction_bias: shifts which experts are chosen, not their weights
    w_gate: list                # one weight an expert
    w_up: list
    w_down: list
    shared: GatedMLP            # the n_shared_experts, joined into one MLP

    def __call__(self, ops, x):
        c = self.config
        weights, ids = ops.moe_route(ops.linear(x, self.router), self.score_bias, c.n_group, c.topk_group,
                                     c.num_experts_per_tok, c.norm_topk_prob, c.routed_scaling_factor)
        return ops.moe_experts(x, ids, weights, self.w_gate, self.w_up, self.w_down) + self.shared(ops, x)


def mlp_shapes(prefix: str, hidden: int, inter: int, suffix: str = "") -> dict[str, tuple]:
    """The shapes of a gated MLP's ffn_gate<suffix> / ffn_up<suffix> / ffn_down<suffix> weights."""
    return {f"{prefix}ffn_gate{suffix}.weight": (inter, hidden), f"{prefix}ffn_up{suffix}.weight": (inter, hidden),
            f"{prefix}ffn_down{suffix}.weight": (hidden, inter)}


def moe_shapes(prefix: str, hidden: int, c: MoEConfig) -> dict[str, tuple]:
    e, inter = c.n_routed_experts, c.moe_intermediate_size
    shapes = {f"{prefix}ffn_gate_inp.weight": (e, hidden), f"{prefix}ffn_gate_inp.e_score_correction_bias": (e,),
              **mlp_shapes(prefix, hidden, inter * c.n_shared_experts, "_shexp")}
    for j in range(e):
        shapes.update(mlp_shapes(prefix, hidden, inter, f"_exps.{j}"))
    return shapes


def load_mlp(w, prefix: str, suffix: str = "") -> GatedMLP:
    """w(name) -> the backend's weight."""
    return GatedMLP(*(w(f"{prefix}ffn_{part}{suffix}.weight") for part in ("gate", "up", "down")))


def load_moe(w, prefix: str, c: MoEConfig) -> MoE:
    experts = [load_mlp(w, prefix, f"_exps.{j}") for j in range(c.n_routed_experts)]
    return MoE(c, w(f"{prefix}ffn_gate_inp.weight"), w(f"{prefix}ffn_gate_inp.e_score_correction_bias"),
               [m.w_gate for m in experts], [m.w_up for m in experts], [m.w_down for m in experts],
               load_mlp(w, prefix, "_shexp"))
