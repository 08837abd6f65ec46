"""DeepSeek-V3's multi-token-prediction (MTP) layer, as vLLM's deepseek_mtp runs it: at position p
it reads the token at p + 1 and the target's hidden state at p (its last layer's output before the
final norm), and its logits guess the token at p + 2:

    x = eh_proj([enorm(embed(token)); hnorm(hidden)])      (the embedding zeroed at position 0)
    y = decoder layer(x) at position p, over a latent KV cache of its own
    logits = head(shared_head_norm(y))

y, in place of the target's hidden state, feeds its next guess. The embedding (and, where the
checkpoint has no shared_head.head, the head) is the target's. Over tensor-parallel ranks it is
split as the target's layers (TP_SPLITS: its attention heads, experts' columns and head's vocabulary
rows; eh_proj and the norms whole), its embedding and logits vocab-parallel."""
from __future__ import annotations

from ..config import ModelConfig
from ..quant.qtensor import QTensor
from .deepseek_v3 import DeepseekV3Model, is_dense, load_layer, weight_load
from .weights import weight_loader


def check_mtp_config(config: ModelConfig) -> None:
    """A ValueError where the checkpoint has no multi-token-prediction layer to draft with."""
    if config.architecture != "deepseek_v3":
        raise ValueError(f"speculative_method: 'mtp' needs a model with multi-token-prediction layers "
                         f"(DeepSeek-V3's num_nextn_predict_layers); architecture {config.architecture!r} has none")
    if config.num_nextn_predict_layers == 0:
        raise ValueError("speculative_method: 'mtp' needs the checkpoint's multi-token-prediction layers, but its "
                         "config.json has num_nextn_predict_layers 0")


class DeepseekMTP:
    KV_VALUES = False       # a latent KV cache, as the target's
    num_kv_layers = 1

    def __init__(self, target: DeepseekV3Model, tensors: dict[str, QTensor], ops, index: int = 0):
        """target: the model it drafts for (its embedding, head and attention constants); index:
        the multi-token-prediction layer (weights mtp.<index>.*)."""
        check_mtp_config(target.config)
        self.target, self.ops, self.config, self.layout = target, ops, target.config, target.layout

        load = weight_loader(tensors, weight_load(ops, target.tp))

        def w(name, required=True):
            try:
                return load(name, required)
            except ValueError as e:
                raise ValueError(f"speculative_method: 'mtp': {str(e).removeprefix('model: ')}") from None

        p, c = f"mtp.{index}.", self.config
        self.enorm, self.hnorm, self.eh_proj = w(p + "enorm.weight"), w(p + "hnorm.weight"), w(p + "eh_proj.weight")
        self.head_norm = w(p + "shared_head_norm.weight")
        self.head = w(p + "shared_head_head.weight", False)
        if self.head is None:
            self.head = target.lm_head
        self.block = load_layer(w, c, p, is_dense(c, c.num_layers + index))

    def forward(self, input_ids, hidden, positions, meta, kv_cache):
        """input_ids, positions [N] (flat batch), hidden [N, hidden_size]: the hidden state at each
        position before (the target's, or this layer's own y); kv_cache: its (K pages, None) ->
        y [N, hidden_size]."""
        ops, c = self.ops, self.config
        xp = ops.xp
        emb = self.target.tp.embedding(ops, self.target.embed, input_ids)
        emb = xp.where((positions == 0)[:, None], xp.zeros_like(emb), emb)
        x = ops.linear(xp.concatenate([ops.rms_norm(emb, self.enorm, c.rms_eps),
                                       ops.rms_norm(hidden, self.hnorm, c.rms_eps)], axis=-1), self.eh_proj)
        x, residual = self.target.decoder_layer(self.block, x, None, positions, meta, kv_cache[0])
        return x + residual

    def compute_logits(self, y):
        ops = self.ops
        return self.target.tp.logits(ops, ops.linear(ops.rms_norm(y, self.head_norm, self.config.rms_eps), self.head))
