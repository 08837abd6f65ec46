"""The engine: requests in, step loop (schedule -> run -> sample -> update), outputs out."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import numbers
import time
from typing import Iterable, Iterator

import numpy as np

from .api_names import vllm_named
from .args import EngineArgs
from .bad_words import bad_words_token_ids, banned_tokens
from .engine_build import EngineBuild
from .engine_lock import EngineLock
from .engine_outputs import EngineOutputs
from .engine_spec import EngineSpec
from .outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, RequestOutput, ScoringRequestOutput
from .pooling import Pooler, PoolingParams, default_pooling_type
from .progress import Progress
from .sampler import PendingSample, Sampler, SamplerOutput, SamplingRow, make_generator, min_tokens_stops
from .sampling import RequestOutputKind, SamplingParams, truncate_prompt
from .sched.request import PENDING_TOKEN, Request, RequestStatus
from .sched.scheduler import Scheduler
from .sampling_defaults import model_sampling_defaults
from .scoring import classifier_params, classifier_results, classifier_token_ids, cosine_results, score_pairs
from .spec.adaptive import AdaptiveDrafting
from .request_state import RequestGroup, SequenceState
from .stop import StopStringMatcher
from .thinking_budget import CLOSE, OPEN, ThinkingBudget, starts_inside

log = logging.getLogger("pocketcupy")


class LaunchedStep:
    """A step whose forward and sampling are queued on the backend: its sampled sequences, the
    index of each one's PENDING_TOKEN in its output ids, and the pending sample."""

    def __init__(self, seqs: list, slots: list, sample, sync: bool = False):
        self.seqs, self.slots, self.sample = seqs, slots, sample
        self.sync = sync   # its tokens are on the host already (no device ids to feed the next step)
        self.resolved = False

    def feed(self):
        from .runner import TokenFeed

        return TokenFeed(self.sample.tokens, {s.req.request_id: i for i, s in enumerate(self.seqs)})

    def binds_late(self) -> bool:
        """Whether sampling the next step needs this one's tokens on the host (penalties over the
        output so far, a structured-output matcher, bad words of several tokens, a thinking budget
        still open): the next step's forward is launched first, fed from the device, and its sampling
        only once this step is resolved (late binding), so the device computes while the host resolves."""
        return any(s.matcher is not None or s.thinking_open or s.group.params.has_penalties
                   or any(len(w) > 1 for w in s.group.bad_words) for s in self.seqs)


class Engine(EngineBuild, EngineOutputs, EngineSpec):
    def __init__(self, model: str | None = None, device: str = "auto", **engine_args):
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(engine_args) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: not an engine argument (EngineArgs has "
                             f"{', '.join(sorted(known - {'model', 'device'}))})")
        self._setup(EngineArgs(model=model, device=device, **engine_args))

    @classmethod
    def from_args(cls, args: EngineArgs) -> "Engine":
        if not isinstance(args, EngineArgs):
            raise ValueError(f"args: expected EngineArgs, got {type(args).__name__}")
        self = cls.__new__(cls)
        self._setup(args)
        return self

    # --- construction --------------------------------------------------------------------
    def _setup(self, args: EngineArgs) -> None:
        from .backend import resolve_device
        from .loader import load_checkpoint
        from .dist.group import start_ranks
        from .model_cache import default_model_path
        from .tokenizer import Tokenizer

        self.args = args
        self.device = resolve_device(args.device)
        t0 = time.monotonic()
        path = args.model or default_model_path(args.cache_dir)
        ckpt = load_checkpoint(path, mtp=args.speculative_method == "mtp")
        self.model_path, self.config = ckpt.path, ckpt.config
        if args.speculative_method == "mtp":
            self._check_mtp(ckpt.config)
        self.tokenizer = Tokenizer.from_checkpoint(ckpt)
        self.default_sampling = {} if args.generation_config == "vllm" else \
            model_sampling_defaults(ckpt.gguf_metadata, ckpt.path if ckpt.gguf_metadata is None else None)
        self.score_token_ids = None if args.score_tokens is None else \
            classifier_token_ids(self.tokenizer, args.score_tokens)
        if self.default_sampling:
            log.info("sampling defaults from the model: %s (generation_config='vllm' for none)", self.default_sampling)
        self.ranks = start_ranks(args, ckpt, self.device)  # tensor parallel: ranks 1..N-1 load their shards
        try:
            self._load_shard(ckpt, None if self.ranks is None else self.ranks.tp)
            self.draft_model = self._load_draft_model()   # whole, on rank 0 only
            self.mtp_model = self._load_mtp_model(ckpt)
            num_blocks = self._num_kv_blocks()
            if self.ranks is not None:
                num_blocks = self.ranks.agree_num_blocks(num_blocks)  # once every rank is ready
            self.runner = self._make_runner(num_blocks)
            self.draft_runner = None if self.draft_model is None else self._make_runner(num_blocks, self.draft_model)
            if self.ranks is not None:
                self.runner = self.ranks.wrap(self.runner)  # each step's SchedulerOutput goes to every rank
        except BaseException:
            if self.ranks is not None:
                self.ranks.close()
            raise
        args = self.args   # (_load_shard turns prefix caching off for a model with recurrent state)
        self.scheduler = Scheduler(num_blocks, args.block_size, args.max_num_seqs, args.max_num_batched_tokens,
                                   enable_prefix_caching=args.enable_prefix_caching, policy=args.scheduling_policy,
                                   recompute_last_hit_block=args.speculative_method == "mtp")
        if self.device == "cuda":
            from .backend.sampler_cuda import CudaSampler
            self.sampler = CudaSampler(self.tokenizer.eos_token_ids)
        else:
            self.sampler = Sampler(self.tokenizer.eos_token_ids)
        from .structured import StructuredOutputManager
        self.structured = StructuredOutputManager(self.tokenizer, self.config.vocab_size)
        # thinking_token_budget's markers; reasoning_parser: the server's --reasoning-parser, which decides
        # whether a prompt opened the reasoning block (thinking_budget.starts_inside)
        self.thinking_markers = tuple(tuple(self.tokenizer.encode(m, add_special_tokens=False)) for m in (OPEN, CLOSE))
        self.reasoning_parser: str | None = None
        # live requests by id (an id is free again once its request finished or was aborted)
        self._groups: dict[str, RequestGroup] = {}
        self._seqs: dict[str, SequenceState] = {}
        self._ended: list[RequestGroup] = []   # aborted, owing their final output to the next step()
        self._held: dict[int, RequestGroup] = {}   # add_request's, with outputs owed to the caller's next step()
        self._lock = EngineLock()
        self.proposer = self._make_proposer(num_blocks)
        self.drafting = AdaptiveDrafting(args.num_speculative_tokens, adaptive=args.speculative_adaptive)
        # with a proposer, a step stays in flight only where no request drafts at the next (EngineSpec._plan_drafts)
        self._async = args.async_scheduling == "on" or (
            args.async_scheduling == "auto" and self.device == "cuda" and self.ranks is None)
        self._inflight: LaunchedStep | None = None   # async scheduling: the step whose tokens are awaited
        self._ids = itertools.count()
        self._rng = make_generator(args.seed)
        self._step_stats: dict | None = None   # stats() as the step in progress began (None: no step runs)
        self.load_time_s = time.monotonic() - t0
        states = getattr(self.runner, "states", None)   # a hybrid model's (state_slots.py)
        usable = self.scheduler.num_blocks_total   # (as stats() and the server's ready line count: no null block)
        log.info("loaded %s on %s in %.1fs; KV cache %d blocks x %d tokens (%.0f MiB)%s", path, self.device,
                 self.load_time_s, usable, args.block_size, usable * self._kv_block_bytes() / 2**20,
                 "" if states is None else
                 f"; recurrent state {states.num_slots} slots ({states.nbytes / 2**20:.0f} MiB)")

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do on one rank); no steps after this."""
        if getattr(self, "ranks", None) is not None:
            with self._lock:
                self.ranks.close()

    # --- requests ------------------------------------------------------------------------
    def _prompt_ids(self, prompt, field: str = "prompt") -> tuple[str | None, list[int]]:
        """field: the argument named in errors; "prompt_token_ids" takes token ids only."""
        if isinstance(prompt, str) and field == "prompt":
            ids = self.tokenizer.encode(prompt)
            text = prompt
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                       for t in prompt):
            ids, text = [int(t) for t in prompt], None
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"{field}: token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1})")
        else:
            raise ValueError(f"{field}: must be a " + ("string or a " if field == "prompt" else "") + "list of token ids")
        if not ids:
            raise ValueError(f"{field}: must not be empty")
        return text, ids

    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None, priority: int = 0,
                    prompt_token_ids: list[int] | None = None) -> None:
        """Queue a request. `prompt` is text or token ids; `prompt_token_ids` overrides the tokenization
        of a text prompt (the text is then only echoed back). The id of a request that finished or
        was aborted may be used again at once (its last output still comes, from the next step())."""
        self._add_request(request_id, prompt, params, priority, prompt_token_ids)

    def _add_request(self, request_id: str, prompt, params: SamplingParams | None = None, priority: int = 0,
                     prompt_token_ids: list[int] | None = None, mailbox=None,
                     pooling: PoolingParams | None = None, name_it: bool = False) -> str:
        """mailbox: an object whose append() gets each of this request's outputs as step() makes them
        (whichever thread runs it), so that outputs never go by id to a later request of that id.
        pooling: an embedding request (params ignored): its prompt's final hidden states pooled into
        RequestOutput.embedding; its one sampled token is not part of the result.
        name_it: request_id is a prefix, the id the first free request_id-N (_free_id). Returns the id."""
        if pooling is not None:
            if not isinstance(pooling, PoolingParams):
                raise ValueError(f"pooling: expected PoolingParams, got {type(pooling).__name__}")
            params = SamplingParams(max_tokens=1, temperature=0.0,
                                    truncate_prompt_tokens=pooling.truncate_prompt_tokens)
        params = self.get_default_sampling_params() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params: expected SamplingParams, got {type(params).__name__}")
        # the request's own copy, checked again: a field set after construction (n=0 hung generate(),
        # max_tokens=0 failed mid-step) is a ValueError here, and later changes to the caller's don't reach it
        params = params.clone()
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id: must be a non-empty string")
        if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):
            raise ValueError(f"priority: must be an integer, got {priority!r}")
        priority = int(priority)   # (a NumPy integer too)
        if priority != 0 and self.args.scheduling_policy != "priority":   # vLLM's ValueError too
            raise ValueError(f"priority: got {priority}, but priority scheduling is not enabled (scheduling_policy "
                             f"is {self.args.scheduling_policy!r}; start the engine with scheduling_policy='priority')")
        k = params.truncate_prompt_tokens
        if k is not None and k > self.max_model_len:   # (vLLM's ValueError too)
            raise ValueError(f"truncate_prompt_tokens: {k} is more than max_model_len ({self.max_model_len}); "
                             "use at most that, or -1 for the last max_model_len tokens")
        if isinstance(prompt, dict):
            prompt, prompt_token_ids = prompt_of_dict(prompt, prompt_token_ids)
        text, ids = (self._prompt_ids(prompt) if prompt_token_ids is None
                     else self._prompt_ids(prompt_token_ids, "prompt_token_ids"))
        if prompt_token_ids is not None and isinstance(prompt, str):
            text = prompt
        kept = truncate_prompt(ids, params.truncate_prompt_tokens, self.max_model_len)
        if len(kept) < len(ids):   # the text, if given, becomes that of the tokens kept
            text, ids = None if text is None else self.tokenizer.decode(kept), kept
        # an embedding's one sampled token is dropped and needs no K/V, so its prompt may fill the context
        fills_context = pooling is not None and len(ids) == self.max_model_len
        max_tokens = 1 if fills_context else self._max_tokens(len(ids), params)
        for name, tokens in (("logit_bias", params.logit_bias), ("allowed_token_ids", params.allowed_token_ids),
                             ("preserved_token_ids", params.preserved_token_ids),
                             ("stop_token_ids", params.stop_token_ids)):
            if tokens and max(tokens) >= self.config.vocab_size:
                raise ValueError(f"{name}: token id {max(tokens)} is outside the vocabulary "
                                 f"(0..{self.config.vocab_size - 1})")
        if params.allowed_token_ids and params.min_tokens:
            if set(params.allowed_token_ids) <= set(min_tokens_stops(params, self.tokenizer.eos_token_ids)):
                raise ValueError("min_tokens: allowed_token_ids hold only stop tokens (EOS, stop_token_ids), which "
                                 "min_tokens forbids: no token could be sampled")
        if params.allowed_token_ids and params.structured_outputs is not None:
            raise ValueError("allowed_token_ids: cannot be combined with structured outputs (their masks could "
                             "leave no token)")
        with self._lock:
            if name_it:
                request_id = self._free_id(request_id, params.n)
            seq_ids = sequence_ids(request_id, params.n)
            used = next((s for s in [request_id, *seq_ids] if self._in_use(s)), None)
            if used is not None:
                raise ValueError(f"request_id: {used!r} is already in use")
            if params.structured_outputs is not None:
                self.structured.prepare(params.structured_outputs)  # compiles; ValueError if it cannot
            group = RequestGroup(request_id, text, ids, params, allowed_mask=self._allowed_mask(params),
                                 bad_words=bad_words_token_ids(self.tokenizer, params.bad_words), mailbox=mailbox,
                                 pooler=None if pooling is None else Pooler(pooling))
            for i, seq_id in enumerate(seq_ids):
                req = Request(seq_id, list(ids), max_tokens, priority=priority,
                              want_prompt_logits=(params.prompt_logprobs is not None or pooling is not None) and i == 0,
                              prompt_hidden=pooling is not None)
                group.seqs.append(self._new_sequence(group, i, req))
            # only now into the scheduler, so a request that fails above leaves nothing behind; the n
            # sequences need the same blocks, so only the first can be refused (ValueError)
            for s in group.seqs:
                self.scheduler.add(s.req)
            self._groups[request_id] = group
            for s in group.seqs:
                self._seqs[s.req.request_id] = s
            if params.structured_outputs is not None:   # counted once admitted, not where refused above
                self.structured.stats.num_requests += 1
        return request_id

    def _in_use(self, request_id: str) -> bool:
        return request_id in self._groups or request_id in self._seqs

    def _free_id(self, prefix: str, n: int) -> str:
        """The id of a request the engine names (generate()'s gen-N, a step loop's req-N, ...): the next
        prefix-N that neither a live request nor a sequence holds (add_request may have taken such a name:
        generate() failed with "request_id: 'gen-3' is already in use", an id its caller never gave)."""
        while True:
            request_id = f"{prefix}-{next(self._ids)}"
            if not any(self._in_use(s) for s in [request_id, *sequence_ids(request_id, n)]):
                return request_id

    def get_tokenizer(self):
        """The model's Tokenizer (vLLM's LLM.get_tokenizer): encode, decode, apply_chat_template (which
        returns the text)."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without params gets: the model's recommended settings (default_sampling)."""
        return SamplingParams(**self.default_sampling)

    def _max_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        room = self.max_model_len - prompt_len
        if room <= 0:
            raise ValueError(f"prompt: {prompt_len} tokens do not fit the context of {self.max_model_len} tokens")
        if params.max_tokens is None:  # up to the context, or what the KV pool holds if that is less
            pool_room = self.scheduler.num_blocks_total * self.args.block_size + 1 - prompt_len   # (last: no K/V)
            return max(1, min(room, pool_room))  # a prompt that cannot fit is refused by the scheduler
        if params.max_tokens > room:
            raise ValueError(f"max_tokens: prompt ({prompt_len} tokens) plus max_tokens ({params.max_tokens}) "
                             f"exceeds the context of {self.max_model_len} tokens")
        return params.max_tokens

    def _allowed_mask(self, params: SamplingParams) -> np.ndarray | None:
        if not params.allowed_token_ids:
            return None
        mask = np.zeros(self.config.vocab_size, dtype=bool)
        mask[params.allowed_token_ids] = True
        return mask

    def _new_sequence(self, group: RequestGroup, index: int, req: Request) -> SequenceState:
        from .tokenizer import IncrementalDetokenizer

        p = group.params
        if p.seed is not None:
            gen = make_generator(p.seed + index)
        else:
            gen = make_generator(int(self._rng.integers(2**63)))
        row = SamplingRow(p, req.prompt_token_ids, req.output_token_ids, gen, allowed_mask=group.allowed_mask)
        stop = StopStringMatcher(p.stop, p.include_stop_str_in_output) if p.stop else None
        detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, p.skip_special_tokens,
                                       p.preserved_token_ids)
        out = CompletionOutput(index, logprobs=[] if p.logprobs is not None else None,
                               cumulative_logprob=None if p.logprobs is None else 0.0)
        matcher = None if p.structured_outputs is None else self.structured.new_matcher(p.structured_outputs)
        return SequenceState(group, index, req, row, detok, stop, out, matcher=matcher,
                             thinking=self._thinking_budget(group))

    def _thinking_budget(self, group: RequestGroup) -> ThinkingBudget | None:
        budget = group.params.thinking_token_budget
        if budget is None:
            return None
        inside = starts_inside(self.reasoning_parser, self.tokenizer.decode(group.prompt_ids[-16:]))
        return ThinkingBudget(budget, *self.thinking_markers, inside=inside)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Aborts a request, or each of an iterable of them (as vLLM's); unknown ids are ignored.
        Their final outputs (finish_reason "abort") come from the next step(); their ids are free
        at once."""
        try:
            ids = [request_id] if isinstance(request_id, str) else list(request_id)
        except TypeError:
            ids = [request_id]
        bad = [rid for rid in ids if not isinstance(rid, str)]
        if bad:
            raise ValueError(f"request_id: must be a string or an iterable of strings, got {bad[0]!r}")
        with self._lock:
            for rid in ids:
                group = self._groups.get(rid)
                if group is not None:
                    self._abort(group)

    def _abort_request_of(self, request_id: str, mailbox, refused: bool = False) -> None:
        """Aborts the request of that id if its outputs go to mailbox (the id may be another's by now).
        refused: the call that added it was refused after it was admitted (a later prompt of the call
        was), so it is not counted as a structured-output request either."""
        with self._lock:
            group = self._groups.get(request_id)
            if group is not None and group.mailbox is mailbox:
                self._abort(group)
                if refused and group.params.structured_outputs is not None:
                    self.structured.stats.num_requests -= 1

    def _abort(self, group: RequestGroup) -> None:
        for s in group.seqs:
            if not s.output.finished():
                self._finish(s, RequestStatus.FINISHED_ABORTED)
        self._forget(group)
        self._ended.append(group)

    def has_unfinished_requests(self) -> bool:
        """True while a request runs, or while outputs that generate()'s steps made for it wait for step()."""
        with self._lock:
            return self.scheduler.has_unfinished() or self._inflight is not None or bool(self._held)

    def has_pending_outputs(self) -> bool:
        """True when an aborted request still owes its final output to the next step(), or outputs
        made by generate()'s steps wait for it."""
        with self._lock:
            return bool(self._ended or self._held)

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix block (vLLM's LLM.reset_prefix_cache); False, and nothing forgotten,
        while a request holds blocks."""
        with self._lock:
            return self.scheduler.kv_cache_manager.reset_prefix_cache()

    def stats(self, wait: bool = True) -> dict:
        """Counters a server exports (see server/metrics.py): the scheduler's, the recurrent state
        slots' bytes (a hybrid model's; else 0), and the structured output's (constrained requests,
        mask-fill times). wait=False (a /metrics scrape): while a step runs, its counters as that step
        began, instead of waiting the step out (a 2048-token prefill chunk on the CPU held a scrape
        20 s, past Prometheus' scrape timeout)."""
        while not self._lock.acquire(blocking=wait):
            if (snapshot := self._step_stats) is not None:
                return snapshot
            time.sleep(0.001)   # (something short holds the lock: a request added, aborted)
        try:
            return self._stats()
        finally:
            self._lock.release()

    def _stats(self) -> dict:
        return {**self.scheduler.get_stats(), "recurrent_state_bytes": self._state_slot_bytes(),
                "structured": self.structured.stats.snapshot()}

    # --- the step loop -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduling step: returns an output for every request that progressed or finished.
        With async scheduling the step's sampled tokens reach the host during the next call, which
        has already launched the step after it (so the device never waits for the host); a
        request that stopped at a token then computed one step in vain, whose token is dropped.

        An error of one request's own (its sampling row, grammar, detokenizer, stop strings, prompt
        logprobs) ends that request alone, with finish_reason "error" (its mailbox, e.g. a server's
        stream, gets the exception); any other error (the batch's forward) ends every request so,
        and the engine goes on with new ones. So does a KeyboardInterrupt inside the step, raised
        once the requests' outputs are out.

        The outputs that generate()'s (chat()'s, ...) steps made for add_request's requests come
        from the next step() (one output a request, the deltas since the last one)."""
        return self._step_outputs(hold=False)

    def _step_outputs(self, hold: bool) -> list[RequestOutput]:
        """hold: a step of generate()'s (_run), whose caller reads only its own requests' mailboxes: the
        outputs of requests without a mailbox (add_request's) wait for step() instead of being lost."""
        self._lock.yield_to_waiters()
        with self._lock:
            self._step_stats = self._stats()
            try:
                return self._locked_step(hold)
            finally:
                self._step_stats = None

    def _locked_step(self, hold: bool) -> list[RequestOutput]:
        # the requests with an output this step, by id(group): an aborted request and a new one
        # of the same id may both have one
        touched = {id(g): g for g in self._ended}
        self._ended = []
        if not hold:
            touched.update(self._held)
            self._held = {}
        interrupt = None
        try:
            self._step(touched)
        except Exception as e:   # not one request's: none can go on, and none may hang
            log.exception("engine step failed: every request ends")
            self._fail_step(e, touched)
        except BaseException as e:   # a KeyboardInterrupt mid-step: the step is half done, so it failed
            self._fail_step(RuntimeError(f"the engine step was interrupted ({type(e).__name__})"), touched)
            interrupt = e   # raised once the requests' outputs are out (add_request's: from the next step())
        if hold or interrupt is not None:   # (their output is built later: the deltas add up till then)
            for key, g in list(touched.items()):
                if g.mailbox is None:
                    self._held[key] = touched.pop(key)
                    if g.finished:
                        self._forget(g)
        outputs = []
        for g in touched.values():
            out = self._request_output(g)
            if out is None:   # (output_kind FINAL_ONLY, not finished)
                continue
            if g.mailbox is not None:
                g.mailbox.append(g.error if out.finished and g.error is not None else out)
            if out.finished:
                self._forget(g)
            outputs.append(out)
        if interrupt is not None:
            raise interrupt
        return outputs

    def _fail_step(self, error: Exception, touched: dict) -> None:
        """A step that failed as a whole ends every request with finish_reason "error" (a request left
        half-stepped, e.g. with its tokens computed but none sampled, hung: it never progressed).
        Blocks enter the prefix cache when their tokens are scheduled, so the failed step's may name K/V
        never computed (a later prompt with that prefix got it, and wrong tokens): the cache is emptied."""
        self._inflight = None
        for g in list(self._groups.values()):
            self._fail(g, error)
            touched[id(g)] = g
        if not self.scheduler.kv_cache_manager.reset_prefix_cache():
            log.error("the prefix cache could not be emptied after a failed step: a block is still held")

    def _step(self, touched: dict) -> None:
        prev, self._inflight = self._inflight, None
        sched_out = self.scheduler.schedule()
        for seq_id in sched_out.preempted_ids:   # recomputed from its first token
            s = self._seqs[seq_id]
            s.prompt_chunks.clear()
            if s.group.pooler is not None and s.group.embedding is None:
                s.group.pooler = Pooler(s.group.pooler.params)
        t0 = time.perf_counter()
        cur = self._launch(sched_out, prev, touched) if sched_out.scheduled else None
        if not sched_out.scheduled and sched_out.finished_ids:
            self.runner.execute(sched_out)   # nothing to compute: the runner frees what ended requests held
        if prev is not None:   # (unless _launch resolved it before sampling: late binding)
            self._resolve(prev, touched)
        in_flight = cur is not None and bool(cur.seqs) and self._async and not cur.sync
        plan = None   # with a proposer: each sequence that may draft at the next step, and how many
        if in_flight and self.proposer is not None:   # planned before this step's tokens are known
            plan = self._plan_drafts(touched, cur)
            in_flight = plan is not None and not any(k for _, k in plan)
        if in_flight:
            self._inflight = cur
        elif cur is not None:
            self._resolve(cur, touched)
        if self.proposer is not None:   # (a step left in flight: what it cost the engine, the device overlapping)
            self._time_step(sched_out, time.perf_counter() - t0)
            if not in_flight:
                self._propose(touched.values(), plan)

    def _forget(self, g: RequestGroup) -> None:
        """A finished request's id and sequence ids freed (unless a new request holds them already)."""
        if self._groups.get(g.request_id) is g:
            del self._groups[g.request_id]
        for s in g.seqs:
            if self._seqs.get(s.req.request_id) is s:
                del self._seqs[s.req.request_id]

    def _launch(self, sched_out, prev: LaunchedStep | None, touched: dict) -> LaunchedStep | None:
        """Runs the forward and launches sampling; each sampled sequence gets a PENDING_TOKEN
        (so the next schedule sees its gap). prev: the step whose tokens are still awaited; resolved
        here, after the forward is launched and before sampling, when the sampling needs its tokens
        (binds_late). A step with draft tokens is verified here, at once (None then)."""
        feed = None if prev is None else prev.feed()
        run_out = self.runner.execute(sched_out, feed, self._graph_sample_params(sched_out))
        if run_out.pre_norm_hidden is not None:   # for the MTP layer, once the step's tokens are known
            self.proposer.take_hidden(sched_out, run_out.pre_norm_hidden,
                                      [self._seqs[item.request_id].req for item in sched_out.scheduled])
        seqs = [self._seqs[i] for i in run_out.sample_ids]
        self.scheduler.on_step_done(sched_out)
        # on the CPU while the device runs the forward: the previous step's tokens, then the masks
        if prev is not None and prev.binds_late():
            self._resolve(prev, touched)
        self._constrain_rows(seqs, touched)
        for seq_id, chunk in run_out.prompt_logits.items():
            s = self._seqs[seq_id]
            try:
                self._collect_prompt_logits(s, chunk)
            except Exception as e:   # (its prompt logprobs)
                self._fail(s.group, e, touched)
        if any(item.num_draft for item in sched_out.scheduled):
            self._verify_and_roll_back(sched_out, run_out.logits, seqs, touched)
            return None
        sync = False
        if run_out.sampled is not None:
            sample = self.sampler.pending(run_out.sampled, [s.row for s in seqs])
        elif not seqs:
            sample = None
        else:
            try:
                sample = self.sampler.launch(run_out.logits, [s.row for s in seqs])
            except Exception:   # find the rows at fault: each sampled alone
                if prev is not None:   # (first: the CUDA sampler's rows alone reuse its in-flight result buffer)
                    self._resolve(prev, touched)
                sample, sync = self._sample_apart(run_out.logits, seqs, touched), True
        slots = []
        for s in seqs:
            slots.append(s.req.num_output_tokens)
            if not s.output.finished():   # (unless it failed in this step)
                self.scheduler.append_token(s.req.request_id, PENDING_TOKEN)
        return LaunchedStep(seqs, slots, sample, sync)

    def _sample_apart(self, logits, seqs: list[SequenceState], touched: dict) -> PendingSample:
        """For a step whose sampling raised: each row sampled alone, the requests whose row raises
        failed, the others' tokens kept (already on the host)."""
        toks, lps = [], []
        for i, s in enumerate(seqs):
            tok, lp = 0, None
            if not s.output.finished():
                try:
                    out = self.sampler.launch(logits[i:i + 1], [s.row]).result()
                    tok, lp = int(out.token_ids[0]), out.logprobs[0]
                except Exception as e:
                    self._fail(s.group, e, touched)
            toks.append(tok)
            lps.append(lp)
        result = SamplerOutput(np.asarray(toks, np.int64), lps)
        return PendingSample(None, lambda: result)

    def _constrain_rows(self, seqs: list[SequenceState], touched: dict) -> None:
        """The sampling rows' structured-output masks and bad words for the sequences' next token;
        a sequence whose grammar or bad words raise fails its request. A sequence that finished (in
        the step resolved after this one's forward) is left as it is: its token is dropped."""
        seqs = [s for s in seqs if not s.output.finished()]
        try:
            self._constrain(seqs)
        except Exception:
            for s in seqs:
                try:
                    self._constrain([s])
                except Exception as e:
                    self._fail(s.group, e, touched)

    def _constrain(self, seqs: list[SequenceState]) -> None:
        self.structured.fill_masks(seqs)
        for s in seqs:
            if s.thinking is not None:   # (a row without a matcher: no mask, unless a token is forced)
                s.row.packed_mask = s.thinking.mask(s.row.packed_mask if s.matcher is not None else None,
                                                    self.config.vocab_size)
            if s.group.bad_words:   # (where they and the masks forbid every token, the sampler fails the row)
                s.row.banned_ids = banned_tokens(s.group.bad_words, s.req.output_token_ids)

    def _graph_sample_params(self, sched_out):
        """For runner.execute: the sampled rows' parameters when the device sampler can run inside
        the decode graph (no structured-output mask, bad words or thinking budget, known only later)."""
        graph_params = getattr(self.sampler, "graph_params", None)
        if graph_params is None:
            return None

        def params(V: int):
            seqs = [self._seqs[s.request_id] for s in sched_out.scheduled if s.sample]
            if any(s.matcher is not None or s.group.bad_words or s.thinking_open for s in seqs):
                return None
            return graph_params([s.row for s in seqs], V)
        return params

    def _resolve(self, step: LaunchedStep, touched: dict) -> None:
        """The launched step's tokens on the host: each replaces its PENDING_TOKEN and is appended
        to its output (sequences that finished meanwhile drop theirs). Once only."""
        if step.resolved or not step.seqs:
            return
        step.resolved = True
        result = step.sample.result()
        for s, slot, tok, lp in zip(step.seqs, step.slots, result.token_ids.tolist(), result.logprobs):
            if s.output.finished():
                continue
            s.req.output_token_ids[slot] = tok
            self._append(s, tok, lp)
            touched[id(s.group)] = s.group

    # --- convenience APIs ----------------------------------------------------------------
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None, *,
                 sampling_params=None, use_tqdm=False) -> list[RequestOutput]:
        """Run many prompts concurrently to completion; outputs in the order of the prompts.
        sampling_params: params by vLLM's name for them (so for chat, stream; embed's and score's pooling_params).
        use_tqdm (vLLM's; also chat, embed, score): true (or a callable) draws a progress bar of the
        finished prompts on stderr."""
        params = vllm_named(params, sampling_params, "params", "sampling_params")
        prompts = as_prompt_list(prompts)
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"params: {len(params)} SamplingParams for {len(prompts)} prompts")
            plist = list(params)
        else:
            plist = [params] * len(prompts)
        # whole outputs, whatever output_kind asks (vLLM's LLM.generate too)
        plist = [p.clone(output_kind=RequestOutputKind.FINAL_ONLY)
                 if isinstance(p, SamplingParams) and p.output_kind is RequestOutputKind.DELTA else p for p in plist]
        final = {i: out for i, out in self._run("gen", list(zip(prompts, plist)), progress=use_tqdm)
                 if out.finished}
        return [final[i] for i in range(len(prompts))]

    def embed(self, prompts, pooling: PoolingParams | None = None, *,
              pooling_params=None, use_tqdm=False) -> list[EmbeddingRequestOutput]:
        """Embeddings of many prompts (text or token ids), run concurrently and alongside any
        generation: each prompt's final hidden states pooled (PoolingParams; default: the model's
        own pooling, else the last token's, scaled to unit length). In the order of the prompts."""
        pooling = vllm_named(pooling, pooling_params, "pooling", "pooling_params")
        requests = [(prompt, None) for prompt in as_prompt_list(prompts)]
        final = {i: out for i, out in self._run("embd", requests, self.pooling_or_default(pooling), use_tqdm)
                 if out.finished}
        return [self.embedding_output(final[i]) for i in range(len(requests))]

    def score(self, text_1, text_2, pooling: PoolingParams | None = None, *,
              pooling_params=None, use_tqdm=False) -> list[ScoringRequestOutput]:
        """vLLM's score: of each pair, text_1 one text (scored against each of text_2) or as many as
        text_2 (side by side); texts or token ids. The cosine similarity of their embeddings (embed()'s,
        with this pooling), or with score_tokens a reranker's P(yes) after the pair. In pair order."""
        pooling = vllm_named(pooling, pooling_params, "pooling", "pooling_params")
        first, second, pairs = self.score_inputs(text_1, text_2)
        if self.score_token_ids is not None:
            prompts = [self.pair_ids(first[i], second[j]) for i, j in pairs]
            outs = self.generate(prompts, classifier_params(self.score_token_ids), use_tqdm=use_tqdm)
            return classifier_results(prompts, outs, self.score_token_ids)
        ids = (f"score-{next(self._ids)}" for _ in pairs)
        return cosine_results(self.embed(first + second, pooling, use_tqdm=use_tqdm), len(first), pairs, ids)

    @staticmethod
    def score_inputs(text_1, text_2) -> tuple[list, list, list[tuple[int, int]]]:
        """score()'s arguments as lists of prompts, and the (text_1 index, text_2 index) pairs to score."""
        first, second = as_prompt_list(text_1, "text_1"), as_prompt_list(text_2, "text_2")
        return first, second, score_pairs(len(first), len(second))

    def pair_ids(self, first, second) -> list[int]:
        """A reranker's prompt of a pair (texts or token ids): the first's tokens (with the tokenizer's
        special ones) then the second's (without), as a pair tokenizes for Qwen3-Reranker."""
        a = self.tokenizer.encode(first) if isinstance(first, str) else self._prompt_ids(first, "text_1")[1]
        if isinstance(second, str):
            return a + self.tokenizer.encode(second, add_special_tokens=False)
        return a + self._prompt_ids(second, "text_2")[1]

    def pooling_or_default(self, pooling: PoolingParams | None) -> PoolingParams:
        """The model's own pooling (an embedding GGUF's), else the last token's, where none is given."""
        return PoolingParams(default_pooling_type(self.config)) if pooling is None else pooling

    @staticmethod
    def embedding_output(out: RequestOutput) -> EmbeddingRequestOutput:
        """An embedding request's final RequestOutput as embed() returns it."""
        return EmbeddingRequestOutput(out.request_id, out.prompt_token_ids, EmbeddingOutput(out.embedding))

    def _run(self, prefix: str, requests: list[tuple], pooling: PoolingParams | None = None,
             progress=False) -> Iterator[tuple[int, RequestOutput]]:
        """Adds the (prompt, params) (pooling: as embedding requests) as requests named prefix-N and steps
        the engine until they finish, yielding (index in requests, output) as they come. Another thread's
        step() (a concurrent generate() or stream(), a step loop) may produce them: each request's go to
        its mailbox. Aborts what is left when the caller stops early (an exception, a stream closed).
        progress: a bar of the finished requests on stderr."""
        boxes = [collections.deque() for _ in requests]
        ids, pending, adding = [], set(), True
        bar = Progress(len(requests), "processed prompts", enabled=bool(progress))
        try:
            for i, (prompt, params) in enumerate(requests):
                ids.append(self._add_request(prefix, prompt, params, mailbox=boxes[i], pooling=pooling, name_it=True))
                pending.add(i)
            adding = False
            while pending:
                self._step_outputs(hold=True)
                for i, box in enumerate(boxes):
                    while box:
                        out = box.popleft()
                        if isinstance(out, BaseException):   # what failed this request (step())
                            pending.discard(i)
                            raise out
                        if out.finished:
                            pending.discard(i)
                            bar.update()
                        yield i, out
        finally:
            for i in pending:
                self._abort_request_of(ids[i], boxes[i], refused=adding)
            bar.close()

    def chat(self, messages, params=None, tools=None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None, continue_final_message: bool = False, *,
             sampling_params=None, use_tqdm=False, chat_template: str | None = None) -> list[RequestOutput]:
        """One conversation (a list of message dicts) or several (a list of such lists).
        continue_final_message (with add_generation_prompt=False): the model continues the last
        message (e.g. an assistant reply begun by the caller) instead of starting a new one.
        chat_template: a Jinja template's text used instead of the model's (vLLM's)."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: must be a non-empty list of messages or of conversations, "
                             f"got {messages!r:.60}")
        convs = [messages] if isinstance(messages[0], dict) else messages
        params = vllm_named(params, sampling_params, "params", "sampling_params")
        return self.generate([self.chat_prompt_ids(c, tools, add_generation_prompt, chat_template_kwargs,
                                                   continue_final_message, chat_template) for c in convs],
                             params, use_tqdm=use_tqdm)

    def chat_prompt_ids(self, messages: list[dict], tools=None, add_generation_prompt: bool = True,
                        chat_template_kwargs: dict | None = None, continue_final_message: bool = False,
                        chat_template: str | None = None) -> list[int]:
        """One conversation's prompt: the chat template's text, tokenized as the template wrote it
        (no special tokens added)."""
        return self.tokenizer.encode(self.render_chat(messages, tools, add_generation_prompt, chat_template_kwargs,
                                                      continue_final_message, chat_template), add_special_tokens=False)

    def render_chat(self, messages, tools=None, add_generation_prompt=True, chat_template_kwargs=None,
                    continue_final_message: bool = False, chat_template: str | None = None) -> str:
        from .chat_template import check_template_kwargs, template_text
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tools=tools, continue_final_message=continue_final_message,
                                                  chat_template=None if chat_template is None
                                                  else template_text(chat_template),
                                                  **check_template_kwargs(chat_template_kwargs))

    def stream(self, prompt_or_messages, params: SamplingParams | None = None, *,
               sampling_params=None) -> Iterator[str]:
        """Yields text deltas of one request (n must be 1) as they are produced."""
        params = vllm_named(params, sampling_params, "params", "sampling_params")
        prompt, params = self.stream_request(prompt_or_messages, params)
        with contextlib.closing(self._run("stream", [(prompt, params)])) as outs:
            for _, out in outs:  # a stream closed early aborts its request (_run's finally) right away
                if out.outputs[0].delta_text:
                    yield out.outputs[0].delta_text


    def stream_request(self, prompt_or_messages, params: SamplingParams | None) -> tuple[object, SamplingParams]:
        """stream()'s (prompt, params): a conversation's messages through the chat template, the
        model's defaults where params is None; ValueError unless one sequence is asked for."""
        params = self.get_default_sampling_params() if params is None else params
        if isinstance(params, SamplingParams) and params.n != 1:
            raise ValueError("n: stream() yields one sequence; use n=1")
        if isinstance(prompt_or_messages, list) and prompt_or_messages and isinstance(prompt_or_messages[0], dict):
            return self.chat_prompt_ids(prompt_or_messages), params
        return prompt_or_messages, params


def sequence_ids(request_id: str, n: int) -> list[str]:
    """The scheduler's ids of a request's n sampled sequences."""
    return [request_id] if n == 1 else [f"{request_id}#{i}" for i in range(n)]


def prompt_of_dict(prompt: dict, prompt_token_ids) -> tuple:
    """vLLM's TextPrompt {"prompt": text} or TokensPrompt {"prompt_token_ids": ids} (a "prompt" beside
    them is only echoed back) as add_request's (prompt, prompt_token_ids)."""
    unknown = sorted(map(repr, set(prompt) - {"prompt", "prompt_token_ids"}))
    if unknown or not prompt:
        raise ValueError("prompt: a prompt dict has 'prompt' (text) and/or 'prompt_token_ids', got "
                         + (f"key {unknown[0]}" if unknown else "neither"))
    if "prompt_token_ids" in prompt and prompt_token_ids is not None:
        raise ValueError("prompt_token_ids: given both in the prompt dict and as an argument")
    text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids", prompt_token_ids)
    if ids is not None and text is not None and not isinstance(text, str):
        raise ValueError(f"prompt: must be a string beside prompt_token_ids, got {type(text).__name__}")
    return text, ids


def as_prompt_list(prompts, field: str = "prompts") -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if not prompts:
            raise ValueError(f"{field}: must not be empty")
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompts):
            return [list(prompts)]
        return list(prompts)
    raise ValueError(f"{field}: must be a string, a list of token ids, a prompt dict, or a list of those")
