"""The engine's construction: the backend, the model (and a draft model) and the KV pool's size,
the runners and the draft proposer (a part of Engine; tensor-parallel worker ranks use it too)."""
from __future__ import annotations

import dataclasses
import functools
import logging

from .progress import ProgressDict
from .quant.kv_quant import check_kv_head_dim, kv_pair_bytes
from .state_slots import state_slot_bytes

CPU_KV_BYTES = 512 << 20
log = logging.getLogger("pocketcupy")


class EngineBuild:
    def _load_shard(self, ckpt, tp) -> None:
        """The backend, this rank's part of the model (all of it on one rank) and max_model_len;
        tensor-parallel worker ranks run this too (dist/worker.py)."""
        from .models.registry import build_model

        self.ops = self._make_ops()
        if self.args.kv_cache_dtype not in self.ops.kv_cache_dtypes:
            raise ValueError(f"kv_cache_dtype: {self.args.kv_cache_dtype!r} is implemented on the NumPy (cpu) "
                             f"backend only; the {self.device} backend has "
                             f"{', '.join(map(repr, self.ops.kv_cache_dtypes))}")
        check_kv_head_dim(self.args.kv_cache_dtype, ckpt.config.head_dim)
        self.model = build_model(ckpt.config, ProgressDict(ckpt.tensors, self.args.progress), self.ops, tp, ckpt.path)
        self.ops.check_config(ckpt.config)
        if hasattr(self.model, "state_shapes"):
            self._recurrent_state_limits()
        self.max_model_len = self.args.max_model_len or ckpt.config.max_position
        if self.max_model_len > ckpt.config.max_position:
            raise ValueError(f"max_model_len: {self.max_model_len} exceeds the model's context length "
                             f"{ckpt.config.max_position}")

    def _recurrent_state_limits(self) -> None:
        """A model with recurrent state (state_slots.py) cannot restore it from cached blocks: no
        prefix caching. (Rejected drafts are rolled back by running the kept tokens again from the
        state saved before the step: ModelRunner.roll_back.)"""
        a, arch = self.args, self.model.config.architecture
        if a.enable_prefix_caching:
            log.info("prefix caching is off for architecture %r: its recurrent state cannot be restored from "
                     "cached blocks", arch)
            self.args = dataclasses.replace(a, enable_prefix_caching=False)

    def _make_runner(self, num_blocks: int, model=None):
        """The target's runner (model None), or the draft model's."""
        from .runner import ModelRunner

        a = self.args
        pre_norm = model is None and a.speculative_method == "mtp"   # MTP drafts read every row's (eager steps)
        return ModelRunner(model or self.model, self.ops, num_blocks, a.block_size, self.max_model_len,
                           a.max_num_seqs, cuda_graphs=self._cuda_graphs(model or self.model) and not pre_norm,
                           kv_cache_dtype=a.kv_cache_dtype, pre_norm_hidden=pre_norm,
                           graph_rows=decode_graph_rows(a) if model is None else a.max_num_seqs)

    def _check_mtp(self, config) -> None:
        """Before anything is built: MTP drafts need a checkpoint with an MTP layer."""
        from .models.deepseek_mtp import check_mtp_config

        check_mtp_config(config)

    def _load_mtp_model(self, ckpt):
        """The checkpoint's first multi-token-prediction layer (mtp.0.*), over the target's weights."""
        if self.args.speculative_method != "mtp":
            return None
        from .models.deepseek_mtp import DeepseekMTP

        if self.config.num_nextn_predict_layers > 1:
            log.info("speculative_method 'mtp': drafting with the first of %d multi-token-prediction layers",
                     self.config.num_nextn_predict_layers)
        return DeepseekMTP(self.model, ckpt.tensors, self.ops)

    def _load_draft_model(self):
        a = self.args
        if a.speculative_method != "draft_model":
            return None
        from .loader import load_checkpoint
        from .models.registry import build_model, model_class

        try:
            ckpt = load_checkpoint(a.speculative_model)
        except ValueError as e:  # the loader names 'model', which the user gave right
            raise ValueError(f"speculative_model: {str(e).removeprefix('model: ')}") from None
        if hasattr(model_class(ckpt.config), "state_shapes"):
            raise ValueError(f"speculative_model: architecture {ckpt.config.architecture!r} cannot draft: its recurrent "
                             "state cannot roll back rejected draft tokens")
        if ckpt.config.vocab_size != self.config.vocab_size:
            raise ValueError(f"speculative_model: its vocabulary of {ckpt.config.vocab_size} tokens differs from "
                             f"the model's {self.config.vocab_size} (a draft model must share the tokenizer)")
        check_kv_head_dim(a.kv_cache_dtype, ckpt.config.head_dim)
        self.ops.check_config(ckpt.config)
        return build_model(ckpt.config, ProgressDict(ckpt.tensors, a.progress), self.ops, path=ckpt.path)

    def _make_proposer(self, num_blocks: int):
        a = self.args
        if a.speculative_method == "ngram":
            from .spec import NgramProposer
            return NgramProposer(a.num_speculative_tokens, a.prompt_lookup_min, a.prompt_lookup_max)
        if a.speculative_method == "draft_model":
            from .spec import DraftModelProposer
            return DraftModelProposer(self.draft_runner, self.ops.argmax_rows, a.num_speculative_tokens,
                                      self.draft_model.config.max_position, self.scheduler.reserve_slots,
                                      a.max_num_batched_tokens)
        if a.speculative_method == "mtp":
            from .spec import MTPProposer
            drafter = self._make_mtp_drafter(num_blocks)
            # at more than one rank: each plan sent to every rank, whose parts of the MTP layer run with rank 0's
            run = None if self.ranks is None else functools.partial(self.runner.run_drafts, drafter)
            return MTPProposer(drafter, a.num_speculative_tokens, self.scheduler.reserve_slots, run)
        return None

    def _make_mtp_drafter(self, num_blocks: int):
        """The MTP layer's forwards over its K/V pages (on every rank: dist/worker.py)."""
        from .spec.mtp import MTPDrafter

        return MTPDrafter(self.mtp_model, self.ops, num_blocks, self.args.block_size, self.args.kv_cache_dtype)

    def _make_ops(self):
        if self.device == "cpu":
            from .backend.ops_ref import NumpyOps
            return NumpyOps(self.args.quant_activations)
        from .backend.ops_cuda import CudaOps
        return CudaOps(self.args.quant_activations)

    def _kv_block_bytes(self) -> int:
        """One block's K/V over the layers: this rank's KV heads, and the draft model's or MTP
        layer's, which shares the blocks."""
        total = 0
        for m in (self.model, getattr(self, "draft_model", None), getattr(self, "mtp_model", None)):
            if m is not None:
                pair = kv_pair_bytes(self.args.kv_cache_dtype, m.config.head_dim, self.ops.kv_dtype_bytes,
                                     getattr(m, "KV_VALUES", True))
                layers = getattr(m, "num_kv_layers", m.config.num_kv_layers)   # an MTP layer: one
                total += layers * self.args.block_size * m.layout.num_kv_heads * pair
        return total

    def _default_kv_bytes(self) -> int:
        """CPU: a fixed 512 MiB. CUDA: what gpu_memory_utilization leaves after the weights, minus
        room for activations and CUDA graphs."""
        if self.device == "cpu":
            return CPU_KV_BYTES
        import gc

        import cupy

        gc.collect()    # engines dropped by the caller but still in reference cycles give their memory back
        cupy.get_default_memory_pool().free_all_blocks()
        free, total = cupy.cuda.runtime.memGetInfo()
        c = self.config
        activations = 64 * self.args.max_num_batched_tokens * max(c.hidden_size, c.intermediate_size, c.vocab_size // 8)
        return int(free - (1 - self.args.gpu_memory_utilization) * total - activations)

    def _cuda_graphs(self, model) -> bool:
        """Whether the runner of `model` replays decode steps as CUDA graphs: on CUDA unless turned off
        (cuda_graphs) or the model's forward cannot be captured (its CAPTURABLE)."""
        return self.device == "cuda" and self.args.cuda_graphs and getattr(model, "CAPTURABLE", True)

    def _state_slot_bytes(self) -> int:
        """The recurrent state slots of a hybrid model (state_slots.py), max_num_seqs of them and the
        decode graphs' scratch slot; 0 for a model without."""
        shapes = getattr(self.model, "state_shapes", None)
        slots = self.args.max_num_seqs + self._cuda_graphs(self.model)
        return 0 if shapes is None else state_slot_bytes(shapes, slots)

    def _num_kv_blocks(self) -> int:
        """num_kv_blocks, or the blocks kv_cache_memory (default: _default_kv_bytes) holds beside the
        recurrent state slots."""
        a = self.args
        if a.num_kv_blocks is not None:
            return a.num_kv_blocks
        memory, states = max(a.kv_cache_memory or self._default_kv_bytes(), 0), self._state_slot_bytes()
        if states > memory:
            raise ValueError(f"kv_cache_memory: {memory} bytes cannot hold the recurrent state slots of "
                             f"max_num_seqs={a.max_num_seqs} sequences ({states} bytes, {states // a.max_num_seqs} "
                             "a sequence); raise kv_cache_memory or lower max_num_seqs")
        blocks = (memory - states) // self._kv_block_bytes()
        need = -(-self.max_model_len // a.block_size) + 1  # + the reserved null block
        if blocks < need:
            beside = f" beside the recurrent state slots of max_num_seqs={a.max_num_seqs} sequences" if states else ""
            raise ValueError(f"kv_cache_memory: {blocks} KV blocks{beside} cannot hold one max_model_len="
                             f"{self.max_model_len} sequence ({need} blocks); raise kv_cache_memory or lower "
                             f"max_model_len{' or max_num_seqs' if states else ''}")
        return int(blocks)


def decode_graph_rows(a) -> int:
    """Rows of the target's largest decode graph: one a sequence, and with drafts verified on the GPU
    1 + num_speculative_tokens a sequence (runner.per_token_rows); graphs are captured when first used."""
    drafts = a.num_speculative_tokens if a.speculative_method in ("ngram", "draft_model") else 0
    return a.max_num_seqs * (1 + drafts)
