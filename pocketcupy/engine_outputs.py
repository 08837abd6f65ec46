"""The engine's outputs: sampled tokens into each sequence's text, logprobs and stop checks, and
RequestOutputs (a part of Engine)."""
from __future__ import annotations

import logging

import numpy as np

from .input_errors import is_input_error
from .outputs import CompletionOutput, RequestOutput
from .request_state import RequestGroup, SequenceState
from .sampler import prompt_logprobs
from .sampling import RequestOutputKind
from .sched.request import RequestStatus

log = logging.getLogger("pocketcupy")


class EngineOutputs:
    def _collect_prompt_logits(self, s: SequenceState, chunk) -> None:
        """A chunk of the prompt's logits (prompt logprobs), or a pooling.HiddenChunk (pooling)."""
        pooler = s.group.pooler
        if pooler is not None:
            pooler.add(chunk)
            if not s.req.want_prompt_logits:
                s.group.embedding = pooler.result()
            return
        s.prompt_chunks.append(chunk)
        if not s.req.want_prompt_logits:
            logits = np.concatenate(s.prompt_chunks)[: len(s.group.prompt_ids)]
            s.prompt_chunks.clear()
            s.group.prompt_logprobs = self._decorate(
                prompt_logprobs(logits, s.group.prompt_ids, s.group.params.prompt_logprobs), s.group.params)

    def _decorate(self, positions, params):
        """Each Logprob's decoded_token (left None without detokenize)."""
        if not params.detokenize:
            return positions
        for pos in positions:
            for tid, lp in (pos or {}).items():
                lp.decoded_token = self.tokenizer.logprob_token(tid)
        return positions

    def _append(self, s: SequenceState, tok: int, logprobs) -> None:
        """tok (already in the request's token ids) into the sequence's output; stop checks. An
        error there (its grammar, logprobs, detokenizer, stop strings) fails the request alone."""
        try:
            self._append_token(s, tok, logprobs)
        except Exception as e:
            self._fail(s.group, e)

    def _append_token(self, s: SequenceState, tok: int, logprobs) -> None:
        p, out = s.group.params, s.output
        structure_done = s.matcher is not None and s.matcher.accept(tok)
        if s.thinking is not None:
            s.thinking.accept(tok)
        out.token_ids.append(tok)
        out.delta_token_ids.append(tok)
        if out.logprobs is not None:
            out.logprobs.extend(self._decorate([logprobs], p))
            out.cumulative_logprob += logprobs[tok].logprob
        stop_token = (tok in self.tokenizer.eos_token_ids and not p.ignore_eos) or tok in (p.stop_token_ids or ())
        if p.detokenize and (not stop_token or p.include_stop_str_in_output):
            self._emit(s, s.detok.push(tok))
            if out.finished():  # a stop string was hit
                return
        if structure_done and s.matcher.error:  # the constraint could not go on (logged)
            self._finish(s, RequestStatus.FINISHED_ABORTED)
        elif stop_token:
            out.stop_reason = tok if tok in (p.stop_token_ids or ()) else None
            self._finish(s, RequestStatus.FINISHED_STOPPED)
        elif structure_done:  # the structure is complete
            self._finish(s, RequestStatus.FINISHED_STOPPED)
        elif len(out.token_ids) >= s.req.max_tokens or len(s.group.prompt_ids) + len(out.token_ids) >= self.max_model_len:
            self._finish(s, RequestStatus.FINISHED_LENGTH)

    def _emit(self, s: SequenceState, delta: str) -> None:
        if s.stop is None:
            s.output.text += delta
            s.output.delta_text += delta
            return
        # vLLM's min_tokens: the text of the first min_tokens tokens ends no output, so a stop string must
        # complete in a later token (as EOS and stop_token_ids, suppressed until then, can end it only there)
        safe, hit = s.stop.push(delta, check=len(s.output.token_ids) > s.group.params.min_tokens)
        s.output.text += safe
        s.output.delta_text += safe
        if hit:
            s.output.stop_reason = s.stop.matched
            self._finish(s, RequestStatus.FINISHED_STOPPED, flush=False)

    def _finish(self, s: SequenceState, status: RequestStatus, flush: bool = True) -> None:
        """flush=False when a stop string ended the text: nothing held back is emitted then."""
        if flush:
            tail = s.detok.flush()  # bytes of an unfinished UTF-8 character
            if s.stop is not None:
                safe, hit = s.stop.push(tail)
                tail = safe if hit else safe + s.stop.flush()
                if hit:
                    s.output.stop_reason, status = s.stop.matched, RequestStatus.FINISHED_STOPPED
            s.output.text += tail
            s.output.delta_text += tail
        s.output.finish_reason = status.value
        self.scheduler.finish(s.req.request_id, status)

    def _fail(self, g: RequestGroup, error: Exception, touched: dict | None = None) -> None:
        """Ends the request's unfinished sequences with finish_reason "error" (nothing held back is
        flushed: that could raise again); error goes to its mailbox instead of the last output."""
        live = [s for s in g.seqs if not s.output.finished()]
        if not live:
            return
        if g.error is None:
            g.error = error
            if is_input_error(error):   # the client's mistake (a 400 through the server): no traceback
                log.info("request %s failed for its input: %s", g.request_id, error)
            else:
                log.error("request %s failed: %s: %s", g.request_id, type(error).__name__, error, exc_info=error)
        for s in live:
            s.output.finish_reason = RequestStatus.FINISHED_ERROR.value
            self.scheduler.finish(s.req.request_id, RequestStatus.FINISHED_ERROR)
        if touched is not None:
            touched[id(g)] = g

    def _request_output(self, g: RequestGroup) -> RequestOutput | None:
        """The request's output as its output_kind asks (None: FINAL_ONLY before it finished, its
        deltas add up till then)."""
        kind = g.params.output_kind
        if kind is RequestOutputKind.FINAL_ONLY and not g.finished:
            return None
        delta = kind is RequestOutputKind.DELTA
        outs = []
        for s in g.seqs:
            o = s.output
            ids = o.delta_token_ids if delta else o.token_ids
            logprobs = None if o.logprobs is None else o.logprobs[len(o.logprobs) - len(ids):]   # (one per token)
            outs.append(CompletionOutput(o.index, o.delta_text if delta else o.text, list(ids), logprobs,
                                         o.finish_reason, o.stop_reason, o.delta_text, o.delta_token_ids,
                                         o.cumulative_logprob))
            o.delta_text, o.delta_token_ids = "", []  # the delta list now belongs to the output
        prompt_logprobs = g.prompt_logprobs
        if delta:   # sent once
            g.prompt_logprobs = None
        req = g.seqs[0].req
        queued = None if req.first_scheduled_time is None else req.first_scheduled_time - req.arrival_time
        return RequestOutput(g.request_id, g.prompt, g.prompt_ids, outs, prompt_logprobs, g.finished,
                             num_cached_tokens=max(0, req.num_cached_tokens), time_in_queue=queued,
                             embedding=g.embedding if g.finished else None)
