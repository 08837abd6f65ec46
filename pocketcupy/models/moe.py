"""Gated MLPs and the mixtures of experts of DeepSeek-V3 and Qwen3-Next, written against the ops
interface."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import MoEConfig, SparseMoEConfig

# How gated MLPs and mixtures of experts split over tensor-parallel ranks (dist/layout.py), vLLM's
# way: every MLP's intermediate columns (a dense MLP's, each routed expert's, the shared experts')
# cut evenly, gate and up by rows, down by columns, so a rank's MLP output (routed + shared) is a
# partial sum the model all-reduces once. Routers, score biases and shared-expert gates are whole on
# every rank: each routes every token the same way.
MLP_TP_SPLITS = {f"ffn_{part}{kind}": "cols" if part == "down" else "rows"
                 for part in ("gate", "up", "down") for kind in ("", "_exps", "_shexp")}


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
                                # (DeepSeek-V3's sigmoid scores; None with DeepSeek-V2's softmax)
    w_gate: list                # one weight an expert
    w_up: list
    w_down: list
    shared: GatedMLP            # the n_shared_experts, joined into one MLP

    def __call__(self, ops, x):
        c = self.config
        logits = ops.linear(x, self.router)
        if c.scoring_func == "softmax":     # DeepSeek-V2: the softmax scores of the picks, times the factor
            groups = (c.n_group, c.topk_group) if c.topk_method == "group_limited_greedy" else (1, 1)
            weights, ids = ops.moe_route_softmax(logits, c.num_experts_per_tok, False, *groups)
            if c.routed_scaling_factor != 1.0:
                weights = weights * weights.dtype.type(c.routed_scaling_factor)
        else:
            weights, ids = ops.moe_route(logits, self.score_bias, c.n_group, c.topk_group, c.num_experts_per_tok,
                                         c.norm_topk_prob, c.routed_scaling_factor)
        return ops.moe_experts(x, ids, weights, self.w_gate, self.w_up, self.w_down) + self.shared(ops, x)


@dataclass
class SparseMoE:
    """Qwen3-Next's: softmax routing and one shared expert scaled by sigmoid(shared_gate x)."""
    config: SparseMoEConfig
    router: object              # [num_experts, hidden]
    w_gate: list
    w_up: list
    w_down: list
    shared: GatedMLP
    shared_gate: object         # [1, hidden]

    def __call__(self, ops, x):
        c = self.config
        weights, ids = ops.moe_route_softmax(ops.linear(x, self.router), c.num_experts_per_tok, c.norm_topk_prob)
        shared = ops.sigmoid_mul(ops.linear(x, self.shared_gate), self.shared(ops, x))
        return ops.moe_experts(x, ids, weights, self.w_gate, self.w_up, self.w_down) + shared


def graphs_capture(ops, mlps) -> bool:
    """Whether decode steps through these MLPs can be captured in CUDA graphs: no mixture of experts
    whose routing the backend reads on the host (CudaOps.experts_capturable)."""
    capturable = getattr(ops, "experts_capturable", lambda *ws: False)
    return all(capturable(m.w_gate, m.w_up, m.w_down) for m in mlps if isinstance(m, (MoE, SparseMoE)))


def mlp_shapes(prefix: str, hidden: int, inter: int, suffix: str = "") -> dict[str, tuple]:
    """The shapes of a gated MLP's ffn_gate<suffix> / ffn_up<suffix> / ffn_down<suffix> weights."""
    return {f"{prefix}ffn_gate{suffix}.weight": (inter, hidden), f"{prefix}ffn_up{suffix}.weight": (inter, hidden),
            f"{prefix}ffn_down{suffix}.weight": (hidden, inter)}


def _expert_shapes(prefix: str, hidden: int, num_experts: int, inter: int, shared_inter: int) -> dict[str, tuple]:
    """The router's, the shared expert's and each routed expert's weights."""
    shapes = {f"{prefix}ffn_gate_inp.weight": (num_experts, hidden),
              **mlp_shapes(prefix, hidden, shared_inter, "_shexp")}
    for j in range(num_experts):
        shapes.update(mlp_shapes(prefix, hidden, inter, f"_exps.{j}"))
    return shapes


def moe_shapes(prefix: str, hidden: int, c: MoEConfig) -> dict[str, tuple]:
    e, inter = c.n_routed_experts, c.moe_intermediate_size
    bias = {f"{prefix}ffn_gate_inp.e_score_correction_bias": (e,)} if c.scoring_func == "sigmoid" else {}
    return {**_expert_shapes(prefix, hidden, e, inter, inter * c.n_shared_experts), **bias}


def sparse_moe_shapes(prefix: str, hidden: int, c: SparseMoEConfig) -> dict[str, tuple]:
    return {**_expert_shapes(prefix, hidden, c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size),
            f"{prefix}ffn_gate_inp_shexp.weight": (1, hidden)}


def load_mlp(w, prefix: str, suffix: str = "") -> GatedMLP:
    """w(name) -> the backend's weight."""
    return GatedMLP(*(w(f"{prefix}ffn_{part}{suffix}.weight") for part in ("gate", "up", "down")))


def _load_experts(w, prefix: str, num_experts: int) -> tuple[list, list, list]:
    """The routed experts' gate, up and down weights, one list each."""
    experts = [load_mlp(w, prefix, f"_exps.{j}") for j in range(num_experts)]
    return [m.w_gate for m in experts], [m.w_up for m in experts], [m.w_down for m in experts]


def load_moe(w, prefix: str, c: MoEConfig) -> MoE:
    return MoE(c, w(f"{prefix}ffn_gate_inp.weight"),
               w(f"{prefix}ffn_gate_inp.e_score_correction_bias", c.scoring_func == "sigmoid"),
               *_load_experts(w, prefix, c.n_routed_experts), load_mlp(w, prefix, "_shexp"))


def load_sparse_moe(w, prefix: str, c: SparseMoEConfig) -> SparseMoE:
    return SparseMoE(c, w(f"{prefix}ffn_gate_inp.weight"), *_load_experts(w, prefix, c.num_experts),
                     load_mlp(w, prefix, "_shexp"), w(f"{prefix}ffn_gate_inp_shexp.weight"))
