"""Recurrent state slots: a hybrid model's per-sequence state (e.g. Qwen3-Next's conv and gated
delta rule states), beside the paged KV cache, in arrays preallocated for max_num_seqs sequences
within kv_cache_memory (the KV pool gets what they leave: EngineBuild._num_kv_blocks).

A request takes a free slot when it is first scheduled and keeps it through chunked prefill and
decode; its state is zeroed whenever its computation starts at position 0 (new, or recomputed
after preemption), and its slot is freed when the scheduler reports it finished, aborted or
preempted. Unlike K/V pages, a state cannot be restored to an earlier position: no prefix-cache
hits (the engine turns prefix caching off for such models). A step verifying draft tokens saves its
requests' states first; a request whose drafts were not all kept gets its state back and the tokens
it kept run again (ModelRunner.roll_back)."""
from __future__ import annotations

import itertools

import numpy as np

from .sched.output import SchedulerOutput


STATE_DTYPE = np.float32


def state_slot_bytes(shapes: list[tuple[tuple, ...]], num_slots: int) -> int:
    """The bytes StateSlots(ops, shapes, num_slots) allocates."""
    return num_slots * sum(int(np.prod(s)) for layer in shapes for s in layer) * np.dtype(STATE_DTYPE).itemsize


class StateSlots:
    def __init__(self, ops, shapes: list[tuple[tuple, ...]], num_slots: int, scratch: bool = False):
        """shapes: per state layer, the shape of each of its arrays for one sequence. scratch: one
        more slot, never handed out, where a decode graph's padding rows write (scratch_slot)."""
        self.ops = ops
        rows = num_slots + scratch
        self.layers = [tuple(ops.asarray(np.zeros((rows, *s), STATE_DTYPE)) for s in layer) for layer in shapes]
        self.num_slots, self.scratch_slot = num_slots, num_slots if scratch else None
        self.nbytes = state_slot_bytes(shapes, rows)
        self.free = list(range(num_slots - 1, -1, -1))   # popped from the end: slot 0 first
        self.slot_of: dict[str, int] = {}
        self.host_rows = np.zeros(0, np.int64)           # the step's slot of each scheduled request
        self._rows = None
        self._saved = ({}, [])                            # save(): request id -> index, the copies

    def prepare(self, out: SchedulerOutput) -> None:
        """Frees the slots of the requests that ended or were preempted, then sets `host_rows` for the
        step's scheduled requests (a new one takes a free slot; one starting at position 0 has its
        state zeroed)."""
        for rid in itertools.chain(out.finished_ids, out.preempted_ids):
            slot = self.slot_of.pop(rid, None)
            if slot is not None:
                self.free.append(slot)
        rows = []
        for s in out.scheduled:
            slot = self.slot_of.get(s.request_id)
            if slot is None:
                if s.start_position:
                    raise RuntimeError(f"{s.request_id}: a recurrent state must be computed from position 0, "
                                       f"not {s.start_position} (prefix caching cannot restore it)")
                slot = self.slot_of[s.request_id] = self.free.pop()
            if s.start_position == 0:
                for arrays in self.layers:
                    for a in arrays:
                        a[slot] = 0
            rows.append(slot)
        self.host_rows, self._rows = np.asarray(rows, np.int64), None

    def save(self, request_ids: list[str]) -> None:
        """Copies of these requests' states (a verification step's, before it runs), for restore."""
        slots = [self.slot_of[r] for r in request_ids]
        index = self.ops.asarray(np.asarray(slots, np.int64))
        self._saved = (dict(zip(request_ids, range(len(slots)))), [[a[index] for a in arrays] for arrays in self.layers])

    def restore(self, request_ids: list[str]) -> None:
        """These requests' states (maybe none) put back as save() copied them; the copies are then
        released (a verification step's are used once, and are not counted in kv_cache_memory)."""
        at, copies = self._saved
        self._saved = ({}, [])
        if not request_ids:
            return
        pick = self.ops.asarray(np.asarray([at[r] for r in request_ids], np.int64))
        index = self.ops.asarray(np.asarray([self.slot_of[r] for r in request_ids], np.int64))
        for arrays, saved in zip(self.layers, copies):
            for a, c in zip(arrays, saved):
                a[index] = c[pick]

    def use_rows(self, request_ids: list[str]) -> None:
        """host_rows for a batch of these requests (already holding slots)."""
        self.host_rows, self._rows = np.asarray([self.slot_of[r] for r in request_ids], np.int64), None

    @property
    def rows(self):
        """host_rows as the backend's array (what the model's ops read), uploaded when first asked for
        (a step replaying a decode graph passes host_rows with the graph's inputs instead)."""
        if self._rows is None:
            self._rows = self.ops.asarray(self.host_rows)
        return self._rows

    @property
    def num_used(self) -> int:
        return len(self.slot_of)
