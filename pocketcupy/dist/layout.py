"""What one tensor-parallel rank holds of a model: its attention heads, KV heads, MLP columns and
vocabulary rows. Pure arithmetic, checked once against the model's shape.

Attention is split by KV group (a KV head and the query heads that attend with it), as evenly as
the groups allow: SmolLM2's 3 groups of 3 query heads go 2 + 1 over two ranks. With fewer KV
heads than ranks, each KV head is replicated on world / num_kv_heads ranks, which share its
query heads evenly (vLLM's rule). Multi-head latent attention (DeepSeek's MLA) has one latent KV
"head" that every rank computes and caches whole, and its query heads split evenly. MLP columns
split evenly (a mixture of experts': each expert's); the vocabulary in equal shards, the last one
zero-padded. A Gated DeltaNet (Qwen3-Next) splits by key head, each with its value heads
(DeltaNetShard)."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig

# A mixture of experts' MLP sizes (MoEConfig's, SparseMoEConfig's): each expert's columns split evenly
EXPERT_SIZES = ("moe_intermediate_size", "shared_expert_intermediate_size")


@dataclass(frozen=True)
class ShardLayout:
    rank: int
    world: int
    head_dim: int
    q_heads: tuple[int, int]       # [start, stop) of the query heads on this rank
    kv_heads: tuple[int, int]      # [start, stop) of the KV heads on this rank
    intermediate_size: int         # MLP columns on this rank
    vocab_size: int                # the whole vocabulary
    vocab_shard: int               # vocabulary rows per rank (padded)
    deltanet: "DeltaNetShard | None" = None   # a hybrid's Gated DeltaNet heads on this rank

    @classmethod
    def of(cls, config: ModelConfig, rank: int = 0, world: int = 1) -> "ShardLayout":
        """Raises ValueError (naming tensor_parallel_size) when the model cannot be split `world` ways."""
        check_divides(config, world)
        if not 0 <= rank < world:
            raise ValueError(f"rank: must be in 0..{world - 1}, got {rank}")
        nkv, group = config.num_kv_heads, config.num_heads // config.num_kv_heads
        if config.mla is not None:      # the latent on every rank, the query heads in equal parts
            k0, k1 = 0, 1
            q = _even_part(config.num_heads, world, rank)
        elif nkv >= world:
            k0, k1 = _even_part(nkv, world, rank)
            q = (k0 * group, k1 * group)
        else:
            replicas = world // nkv
            k0, k1 = rank // replicas, rank // replicas + 1
            per = group // replicas
            q0 = k0 * group + rank % replicas * per
            q = (q0, q0 + per)
        return cls(rank, world, config.head_dim, q, (k0, k1), config.intermediate_size // world,
                   config.vocab_size, -(-config.vocab_size // world),
                   None if config.gdn is None else DeltaNetShard.of(config.gdn, rank, world))

    @property
    def num_heads(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_shard

    def spans(self, kind: str, shape: tuple = ()) -> list[tuple[int, int, int]]:
        """The (axis, start, stop) pieces of the full tensor (of `shape`) a rank holds, joined in
        order: one (span), or several for a Gated DeltaNet split (gdn_*, DeltaNetShard.spans)."""
        return self.deltanet.spans(kind) if kind.startswith("gdn_") else [self.span(kind, shape)]

    def span(self, kind: str, shape: tuple = ()) -> tuple[int, int, int]:
        """(axis, start, stop) in the full tensor for a split kind: q_rows / kv_rows / ffn_rows /
        vocab_rows split rows (output features), q_cols / ffn_cols split columns (input features);
        q_gate_rows: a query head's rows and its output gate's (Qwen3-Next's gated attention);
        rows / cols cut the rows / columns of a tensor of `shape` in `world` equal parts (for weights
        laid out by query head or MLP column, whose counts check_divides made split evenly)."""
        if kind in ("rows", "cols"):
            length = shape[0 if kind == "rows" else 1]
            per, extra = divmod(length, self.world)
            if extra:
                raise ValueError(f"tensor_parallel_size: {self.world} ranks cannot share {length} {kind} equally")
            return (0 if kind == "rows" else 1), self.rank * per, (self.rank + 1) * per
        d = self.head_dim
        if kind == "q_gate_rows":
            return 0, self.q_heads[0] * 2 * d, self.q_heads[1] * 2 * d
        if kind in ("q_rows", "q_cols"):
            return (0 if kind == "q_rows" else 1), self.q_heads[0] * d, self.q_heads[1] * d
        if kind == "kv_rows":
            return 0, self.kv_heads[0] * d, self.kv_heads[1] * d
        if kind in ("ffn_rows", "ffn_cols"):
            i = self.intermediate_size
            return (0 if kind == "ffn_rows" else 1), self.rank * i, (self.rank + 1) * i
        if kind == "vocab_rows":
            return 0, self.vocab_start, min(self.vocab_start + self.vocab_shard, self.vocab_size)
        raise ValueError(f"unknown tensor-parallel split {kind!r}")


def _even_part(n: int, parts: int, i: int) -> tuple[int, int]:
    """Part i of range(n) cut into `parts` contiguous pieces whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


def check_divides(config: ModelConfig, world: int) -> None:
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"tensor_parallel_size: must be a positive integer, got {world!r}")
    nkv, group = config.num_kv_heads, config.num_heads // config.num_kv_heads
    if config.mla is not None and config.num_heads % world:
        raise ValueError(f"tensor_parallel_size: {world} does not divide the model's {config.num_heads} attention "
                         "heads (multi-head latent attention splits its query heads evenly)")
    if config.mla is None and nkv < world and (world % nkv or group % (world // nkv)):
        raise ValueError(f"tensor_parallel_size: {world} ranks cannot share the model's {nkv} KV heads "
                         f"({group} query heads each): with fewer KV heads than ranks, the ranks must be a "
                         "multiple of the KV heads and split each KV head's query heads evenly")
    if config.intermediate_size % world:
        raise ValueError(f"tensor_parallel_size: {world} does not divide the model's MLP size "
                         f"{config.intermediate_size}")
    for name in EXPERT_SIZES:
        size = getattr(config.moe, name, None)
        if size is not None and size % world:
            raise ValueError(f"tensor_parallel_size: {world} does not divide the experts' MLP size ({name} {size})")


@dataclass(frozen=True)
class DeltaNetShard:
    """A rank's Gated DeltaNet heads: key heads [start, stop) as evenly as they go, and the value
    heads of each (vLLM's split). Its recurrent and conv states hold these heads only."""
    key_heads: tuple[int, int]
    num_key_heads: int             # the whole model's
    per_key: int                   # value heads a key head
    key_dim: int
    value_dim: int                 # a value head's
    out_tiled: bool                # out_proj's columns in llama.cpp's tiled head order

    @classmethod
    def of(cls, g, rank: int, world: int) -> "DeltaNetShard":
        hk = g.linear_num_key_heads
        if hk < world:
            raise ValueError(f"tensor_parallel_size: {world} ranks cannot share the model's {hk} linear-attention "
                             "key heads (each rank needs at least one)")
        return cls(_even_part(hk, world, rank), hk, g.linear_num_value_heads // hk, g.linear_key_head_dim,
                   g.linear_value_head_dim, g.out_proj_tiled)

    @property
    def num_key(self) -> int:
        return self.key_heads[1] - self.key_heads[0]

    @property
    def num_value(self) -> int:
        return self.num_key * self.per_key

    @property
    def conv_dim(self) -> int:
        """This rank's conv channels: its q, k and v."""
        return 2 * self.num_key * self.key_dim + self.num_value * self.value_dim

    def spans(self, kind: str) -> list[tuple[int, int, int]]:
        """gdn_qkv_rows: q, k, v rows of [q; k; v] (in_proj_qkv, the conv); gdn_z_rows: value rows
        (in_proj_z); gdn_heads: one row a value head (in_proj_b / _a, A_log, dt_bias); gdn_qkvz_rows /
        gdn_ba_rows: whole key-head groups of in_proj_qkvz / in_proj_ba as stored; gdn_out_cols:
        out_proj's value columns (per tiled group where out_tiled)."""
        (k0, k1), r, dk, dv = self.key_heads, self.per_key, self.key_dim, self.value_dim
        if kind == "gdn_qkv_rows":
            kd = self.num_key_heads * dk
            return [(0, k0 * dk, k1 * dk), (0, kd + k0 * dk, kd + k1 * dk),
                    (0, 2 * kd + k0 * r * dv, 2 * kd + k1 * r * dv)]
        per_head = {"gdn_z_rows": r * dv, "gdn_heads": r, "gdn_qkvz_rows": 2 * dk + 2 * r * dv, "gdn_ba_rows": 2 * r}
        if kind in per_head:
            return [(0, k0 * per_head[kind], k1 * per_head[kind])]
        if kind == "gdn_out_cols":
            if not self.out_tiled:
                return [(1, k0 * r * dv, k1 * r * dv)]
            hk = self.num_key_heads
            return [(1, (j * hk + k0) * dv, (j * hk + k1) * dv) for j in range(r)]
        raise ValueError(f"unknown tensor-parallel split {kind!r}")
