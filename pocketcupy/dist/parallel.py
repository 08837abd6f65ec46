"""What a model calls to run on one rank of a tensor-parallel group: the rank's layout, its
weight shards, and the collectives after row-parallel layers, the vocab-parallel embedding and
the LM head. On one rank every collective is the identity and every shard the whole tensor,
so a model written against this runs unchanged (same numbers) at tensor_parallel_size=1."""
from __future__ import annotations

from ..config import ModelConfig
from .comm import Communicator
from .layout import ShardLayout
from .shard import shard_tensor, split_kind


class TensorParallel:
    def __init__(self, layout: ShardLayout, comm: Communicator | None = None):
        if layout.world > 1 and comm is None:
            raise ValueError("tensor_parallel_size: more than one rank needs a communicator")
        self.layout, self.comm = layout, comm

    @classmethod
    def single(cls, config: ModelConfig) -> "TensorParallel":
        return cls(ShardLayout.of(config))

    @property
    def world(self) -> int:
        return self.layout.world

    def shard(self, name: str, t, splits: dict[str, str]):
        """This rank's part of the stored tensor `name` (splits: tensor kind -> ShardLayout split)."""
        return shard_tensor(t, split_kind(name, t, splits), self.layout, name)

    def all_reduce(self, x):
        """After a row-parallel layer (attention output, MLP down): the sum of the ranks' partial products."""
        return x if self.world == 1 else self.comm.all_reduce(x)

    def row_parallel_linear(self, ops, x, w, bias=None):
        """x w^T + bias for w split by input columns: the ranks' partial products summed, then the
        (whole) bias added once."""
        if self.world == 1:
            return ops.linear(x, w, bias)
        y = self.all_reduce(ops.linear(x, w))
        return y if bias is None else y + bias

    def embedding(self, ops, table, ids):
        """Vocab-parallel lookup: each rank fills the rows of the ids in its vocabulary range, zeros
        elsewhere, and the all-reduce puts the rows together (each row comes from one rank, exactly)."""
        if self.world == 1:
            return ops.embedding(table, ids)
        xp, lay = ops.xp, self.layout
        local = ids - lay.vocab_start
        inside = (local >= 0) & (local < lay.vocab_shard)
        x = ops.embedding(table, xp.where(inside, local, 0))
        return self.all_reduce(x * inside[:, None].astype(x.dtype))

    def logits(self, ops, local_logits):
        """LM head: every rank's vocabulary columns gathered, padding columns dropped."""
        if self.world == 1:
            return local_logits
        full = self.comm.all_gather(local_logits)
        if full.shape[1] != self.layout.vocab_size:
            full = ops.xp.ascontiguousarray(full[:, :self.layout.vocab_size])
        return full
