"""The simulated model runner: which state each physical mamba block holds, step by step.

The runner's row facts come from mambafuzz/sim/worker/runners.py (one class per vLLM model runner) and the
row's kernel path from mambafuzz/sim/worker/mixers.py (one class per mixer family). This module applies them,
and the worker-side rules both runners share (paths inside the installed `vllm`):

- zeroing fresh blocks: `SchedulerOutput.new_block_ids_to_zero`, applied before anything else
  (vLLM records attention blocks only: mamba blocks are never zeroed); a block nobody wrote
  holds the zeros the KV cache was allocated with until the pool hands it out a second time;
- copy-on-write: `SchedulerOutput.kv_cache_block_copies` (worker `_apply_kv_cache_block_copies`),
  applied after zeroing and before the forward;
- running column (align mode): v1/worker/mamba_utils.py `preprocess_mamba` (V2:
  `preprocess_mamba_align_fused_kernel`): `curr = cdiv(num_computed + num_scheduled, block_size) - 1`;
  v1/attention/backends/utils.py `mamba_get_block_table_tensor` hands the kernels the columns
  from there on. With prefix caching off (`mamba_cache_mode="none"`) the kernels get the
  request's own 1 + k blocks from column 0 and no copies run;
- pre-forward copy (align mode): when the remembered column `prev` (or `(num_computed - 1) //
  block_size` for a request the worker does not know) differs from `curr`, copy
  `table[prev + num_accepted - 1]` into `table[curr]` and reset num_accepted to 1 (V1
  `preprocess_mamba`; V2 `precopy_mamba_align_fused_kernel`);
- the forward: mambafuzz/sim/worker/mixers.py SPEC (read column `curr + num_accepted - 1`, store the state after
  token t in column `curr + t`) or PREFILL (read `curr`, zeros when nothing is computed; store
  only the final state, drafts included, in `curr`); no state is stored at block boundaries
  inside a chunk;
- post-forward copy (spec-decode engines, align mode): mamba_utils.py
  `postprocess_mamba_fused_kernel` (V1 directly, V2 through `run_fused_postprocess_align`): when
  the accepted tokens cross a block boundary `aligned`, copy `table[curr + aligned - (c + 1)]`
  into `table[aligned // block_size - 1]`;
- internal prefill checkpoint (mixers with `num_prefill_checkpoint_blocks`):
  layers/mamba/checkpoint.py `compute_mamba_prefill_checkpoints`, applied to every prefill row;
- writes to the null block are dropped (kernels skip slot ids <= 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mambafuzz.sim.bridge.vllm_compat.api import (
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
)
from mambafuzz.sim.state import EMPTY, PrefixStates, State, next_token
from mambafuzz.sim.worker.mixers import SPEC, mixer_rules
from mambafuzz.sim.worker.runners import RowFacts, runner_rules

ZEROED = State(-1, 0)  # a freshly zeroed block: holds no state of any prefix
UNSET = State(-2, 0)  # a block the model never saw written
_tuple_new = tuple.__new__  # `_tuple_new(RowResult, (...))` is `RowResult(...)` without its constructor's Python frame


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KernelGeometry:
    block_size: int
    hash_block_size: int
    checkpoint_alignment: int | None  # None: the mixer writes no internal checkpoint
    cache_hit_alignment_tokens: int
    drop_eagle_block: bool
    null_block_id: int
    vocab_size: int
    spec_engine: bool = False  # a speculative-decoding engine (MTP/EAGLE)
    num_speculative_tokens: int = 0
    align: bool = True  # mamba_cache_mode "align" (prefix caching on); False: "none"


class RowResult(NamedTuple):
    """What one request's row did in one forward."""

    read_column: int
    read_block: int
    read_state: State
    outputs: list[int]  # the model's greedy token after each scheduled position
    writes: list[tuple[int, int, State, str]]  # (column, block, state, cause)


class RowRead(NamedTuple):
    """What one request's row read in one forward: a lockstep follower's row (`run_rows`)."""

    read_column: int
    read_block: int
    read_state: State


class KernelModel:
    def __init__(self, geometry: KernelGeometry, runner: str = "v1", mixer: str = "gdn",
                 first_use: tuple[set[int], set[int]] | None = None):
        """`first_use`, when given, is the pool's live (allocated, reused) block-id sets: a block
        allocated once and never written still holds the cache's initial zeros."""
        self.g = geometry
        self.runner = runner_rules(runner)
        # Asked at the first step of a spec-decode run, then kept: a model lives for one run,
        # and patches are applied before it starts.
        self._resets_accepted: bool | None = None
        self.mixer = mixer_rules(mixer)
        self.allocated, self.reused = first_use or (set(), set())
        self.held: dict[int, State] = {}
        self.dirty: set[int] = set()
        self._prev_column: dict[str, int] = {}  # worker's mamba_state_idx
        self._num_accepted: dict[str, int] = {}  # worker's num_accepted_tokens_cpu
        # The blocks rows wrote in this forward: block -> (the request whose row wrote it first,
        # what the block held when the forward began). See `begin_forward`.
        # None while the forward runs one row: no other row's write to hide.
        self._row_writes: dict[int, tuple[str, State]] | None = {}

    def state_of(self, block_id: int) -> State:
        state = self.held.get(block_id)
        if state is None:  # never written: zeros on its first owner, else its last user's bytes
            return ZEROED if block_id in self.allocated and block_id not in self.reused else UNSET
        return state

    def _write(self, block_id: int, state: State) -> bool:
        if block_id <= self.g.null_block_id:
            return False
        self.held[block_id] = state
        self.dirty.add(block_id)
        return True

    def begin_forward(self, rows: int) -> None:
        """A new batch's forward begins: every row of it reads the state its block held at this
        point, whatever another row of the same batch writes. The mixers' batched kernels gather
        every sequence's initial state before they scatter any final one (GDN: `initial_state =
        ssm_state[state_indices]`, then `ssm_state[state_indices] = last_state`, qwen3_next.py
        `_forward_core`; the conv kernels run one program per sequence on the same cache), so a
        row cannot see another row's write of the same forward. Only the mixer's own writes
        count as row writes; the copies before the forward (`_precopy`) every row sees. `rows`: the
        forward's row count; a forward of one row has no other row, so nothing is tracked."""
        self._row_writes = {} if rows > 1 else None

    def _row_read(self, rid: str, block_id: int) -> State:
        """What `rid`'s row reads from `block_id` in this forward (see `begin_forward`)."""
        row_writes = self._row_writes
        written = row_writes.get(block_id) if row_writes else None
        if written is not None and written[0] != rid:
            return written[1]
        state = self.held.get(block_id)  # `state_of`'s common case, inline
        return self.state_of(block_id) if state is None else state

    def _row_write(self, rid: str, block_id: int, state: State) -> bool:
        """`_write` by `rid`'s row, remembering what the block held before this forward's first row write."""
        if block_id <= self.g.null_block_id:
            return False
        row_writes = self._row_writes
        if row_writes is not None and block_id not in row_writes:
            row_writes[block_id] = (rid, self.state_of(block_id))
        self.held[block_id] = state
        self.dirty.add(block_id)
        return True

    def take_dirty(self) -> set[int]:
        """Blocks written since the last call: the only ones whose held state can have changed."""
        dirty = self.dirty
        if dirty:
            self.dirty = set()
        return dirty

    def worker_state(self, rid: str) -> tuple[int | None, int]:
        """What the worker keeps for `rid` between rows: its running column (V1's
        `mamba_state_idx`; None before the request's first row) and its accepted-token count
        (`num_accepted_tokens_cpu`, 1 when unknown). Read by the conformance check."""
        return self._prev_column.get(rid), self._num_accepted.get(rid, 1)

    def follow(self, leader: KernelModel) -> None:
        """Keep `leader`'s per-request counts instead of one's own: for a group with the leader's
        geometry, runner and mixer the counts depend on the rows only (WorkerMirror). The leader's
        `run_rows` then runs this model's rows with its own, and only the leader's `begin_step`
        and `forget_requests` need run."""
        self._prev_column = leader._prev_column
        self._num_accepted = leader._num_accepted

    # ---- per-step, before any row --------------------------------------------------
    def forget_requests(self, request_ids: set[str]) -> None:
        for rid in request_ids:
            self._prev_column.pop(rid, None)
            self._num_accepted.pop(rid, None)

    def zero_blocks(self, block_ids: list[int]) -> None:
        null, held, dirty = self.g.null_block_id, self.held, self.dirty
        for b in block_ids:  # `_write`, inline
            if b > null:
                held[b] = ZEROED
                dirty.add(b)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """CoW copies of every group (their sources are published blocks, so written ones for
        the mamba group): what the model wrote is copied, nothing is inferred. All at once, as
        the worker copies them (`blocks[dst] = blocks[src]`, v1/worker/utils.py: one gather of
        every source, then one scatter): a copy whose source is another copy's destination
        copies what that block held before."""
        held = self.held
        states = [held.get(src, UNSET) for src, _ in copies]
        for (_, dst), state in zip(copies, states):
            self._write(dst, state)

    def load_external(self, table: list[int], num_tokens: int, state: State) -> int:
        """A connector load: the state after `num_tokens` lands in that position's column."""
        column = cdiv(num_tokens, self.g.block_size) - 1
        self._write(table[column], state)
        return table[column]

    # ---- one request's row --------------------------------------------------------
    def begin_step(self, scheduled: set[str] | dict[str, int]) -> list[str]:
        """Before this step's rows: V1 forgets the accepted-token count of every request it did
        not schedule (see runners.V1Runner), V2 keeps it. Returns the requests whose count
        this changed (it was above 1)."""
        reset = []
        if self._resets_accepted is None:
            self._resets_accepted = self.runner.resets_accepted_when_unscheduled
        if self._resets_accepted:
            accepted = self._num_accepted
            for rid, count in accepted.items():
                if rid not in scheduled and count != 1:
                    accepted[rid] = 1
                    reset.append(rid)
        return reset

    def is_spec_row(self, num_computed: int, num_scheduled: int, num_drafts: int, num_prompt_tokens: int,
                    prefill_len: int | None = None) -> bool:
        """Whether this row runs the multi-token (SPEC) kernel: the runner's row facts
        (mambafuzz/sim/worker/runners.py), classified by the mixer's metadata builder (mambafuzz/sim/worker/mixers.py)."""
        g = self.g
        facts = RowFacts(num_computed, num_scheduled, num_drafts, num_prompt_tokens,
                         num_prompt_tokens if prefill_len is None else prefill_len)
        inputs = self.runner.builder_inputs(facts, g.spec_engine, g.num_speculative_tokens)
        return self.mixer.path(inputs, num_computed, num_scheduled, g.spec_engine, g.num_speculative_tokens) == SPEC

    def run_row(self, rid: str, table: list[int], num_computed: int, tokens: list[int], num_drafts: int,
                spec_row: bool = False, truth: PrefixStates | None = None, sample: bool = True) -> RowResult:
        """Run `tokens` (the last `num_drafts` of them speculative) from `num_computed`;
        `spec_row` selects the speculative kernel path (see `is_spec_row`). `truth`, the request's
        true prefix states (whose tokens from `num_computed` on are `tokens` without the drafts),
        only makes extending a state cheaper; it never changes a result. `sample` False skips the
        outputs (another mamba group's model: the sampler reads the first group's row)."""
        return self.run_rows(rid, (table,), num_computed, tokens, num_drafts, spec_row, truth, sample=sample)[0]

    def run_rows(self, rid: str, tables: Sequence[list[int]], num_computed: int, tokens: list[int], num_drafts: int,
                 spec_row: bool = False, truth: PrefixStates | None = None, followers: Sequence[KernelModel] = (),
                 sample: bool = True) -> list[RowResult | RowRead]:
        """`run_row` on this model (`tables[0]`) and on each of `followers` (models that `follow`
        this one: other mamba groups with its geometry, runner and mixer; `tables[1:]`), which
        run the same row on their own blocks without sampling. The columns and counts are worked
        out once; a follower that reads the state this model read computes the same states from
        it, so they are computed once too. Returns this model's RowResult, then each follower's
        RowRead: a follower's writes are not reported (nothing reads them: its `held` states are
        what its later rows read)."""
        num_tokens = len(tokens)
        g = self.g
        seq_len = num_computed + num_tokens
        accepted = self._num_accepted.get(rid, 1)
        copy_from = None  # the pre-forward copy's source column
        if g.align:
            bs = g.block_size
            curr = -(-seq_len // bs) - 1  # cdiv, inline
            prev = self._prev_column.get(rid, (num_computed - 1) // bs)
            if prev != -1 and prev != curr:
                copy_from = prev + accepted - 1
                accepted = 1
            self._prev_column[rid] = curr
        else:  # mamba_cache_mode "none": the request's own blocks, from column 0, no copies
            curr = 0
        self._num_accepted[rid] = accepted
        if spec_row:
            return self._spec_rows(rid, tables, num_computed, tokens, curr, accepted, copy_from, followers, sample)

        # the PREFILL kernel; this model's row first
        checkpoint = self._checkpoint_position(num_computed, seq_len) if g.checkpoint_alignment is not None else None
        null = g.null_block_id  # every model here has this model's geometry
        table = tables[0]
        writes: list[tuple[int, int, State, str]] = []
        if copy_from is not None:
            self._precopy(rid, table, copy_from, curr, writes)
        block = table[curr]
        if num_computed > 0:  # `_row_read`, inline
            row_writes = self._row_writes
            written = row_writes.get(block) if row_writes else None
            start = written[1] if written is not None and written[0] != rid else self.held.get(block)
            if start is None:
                start = self.state_of(block)
        else:
            start = EMPTY
        if checkpoint is None and not num_drafts and truth is not None:  # `_prefill`'s common case, inline
            final, at_checkpoint = truth.span(start, num_computed, seq_len), None
            outputs = [next_token(final, g.vocab_size)] if sample else []
        else:
            final, at_checkpoint, outputs = self._prefill(truth, tokens, start, num_computed, num_drafts,
                                                          checkpoint, sample)
        if block > null:  # `_row_write` inline; drafts included: the kernel cannot roll them back
            row_writes = self._row_writes
            if row_writes is not None and block not in row_writes:
                row_writes[block] = (rid, self.state_of(block))
            self.held[block] = final
            self.dirty.add(block)
            writes.append((curr, block, final, "chunk-end+drafts" if num_drafts else "chunk-end"))
        if checkpoint is not None:
            column = cdiv(seq_len, g.block_size) - 2  # the checkpoint's column
            if self._row_write(rid, table[column], at_checkpoint):
                writes.append((column, table[column], at_checkpoint, "checkpoint"))
        rows: list[RowResult | RowRead] = [_tuple_new(RowResult, (curr, block, start, outputs, writes))]
        if not followers:
            return rows
        lead = start
        for i, model in enumerate(followers, 1):  # the same steps, on the follower's own blocks
            table = tables[i]
            if copy_from is not None:
                model._precopy(rid, table, copy_from, curr, None)
            block = table[curr]
            if num_computed > 0:  # `_row_read`, inline
                row_writes = model._row_writes
                written = row_writes.get(block) if row_writes else None
                start = written[1] if written is not None and written[0] != rid else model.held.get(block)
                if start is None:
                    start = model.state_of(block)
            else:
                start = EMPTY
            if start == lead:
                own_final, own_checkpoint = final, at_checkpoint
            else:
                own_final, own_checkpoint, _ = self._prefill(truth, tokens, start, num_computed, num_drafts,
                                                             checkpoint, False)
            if block > null:  # `_row_write` inline, as above
                row_writes = model._row_writes
                if row_writes is not None and block not in row_writes:
                    row_writes[block] = (rid, model.state_of(block))
                model.held[block] = own_final
                model.dirty.add(block)
            if checkpoint is not None:
                model._row_write(rid, table[column], own_checkpoint)
            rows.append(_tuple_new(RowRead, (curr, block, start)))
        return rows

    def _spec_rows(self, rid: str, tables: Sequence[list[int]], num_computed: int, tokens: list[int], curr: int,
                   accepted: int, copy_from: int | None, followers: Sequence[KernelModel],
                   sample: bool) -> list[RowResult | RowRead]:
        """`run_rows`'s speculative (multi-token) kernel, on this model and then each follower."""
        read_col = curr + accepted - 1
        rows: list[RowResult | RowRead] = []
        lead: tuple = ()  # (start, the states the kernel computed from it) of this model's row
        for model, table in zip((self, *followers), tables) if followers else ((self, tables[0]),):
            writes: list[tuple[int, int, State, str]] | None = None if rows else []
            if copy_from is not None:
                model._precopy(rid, table, copy_from, curr, writes)
            inside = read_col < len(table)
            start = model._row_read(rid, table[read_col]) if inside else UNSET
            if start == ZEROED and num_computed == 0:
                start = EMPTY  # no mask, but zeros are exactly the initial state
            if lead and start == lead[0]:
                states, outputs = lead[1], []
            else:
                states = []
                state = start
                for tok in tokens:
                    state = state.extend([tok])
                    states.append(state)
                outputs = [next_token(s, self.g.vocab_size) for s in states] if sample and not rows else []
                if not lead:
                    lead = (start, states)
            for t, state in enumerate(states):
                if curr + t < len(table) and model._row_write(rid, table[curr + t], state) and writes is not None:
                    writes.append((curr + t, table[curr + t], state, "spec-token"))
            read_block = table[read_col] if inside else -1
            rows.append(_tuple_new(RowRead, (read_col, read_block, start)) if rows else
                        _tuple_new(RowResult, (read_col, read_block, start, outputs, writes)))
        return rows

    def _precopy(self, rid: str, table: list[int], src_col: int, curr: int,
                 writes: list[tuple[int, int, State, str]] | None) -> None:
        """The pre-forward copy of column `src_col` into the running column `curr`. The worker
        makes every row's copy in one batched copy before the forward (`preprocess_mamba`,
        v1/worker/mamba_utils.py): its source is read as the forward began, and every row of
        the forward sees what it wrote (a plain write, not a row write)."""
        state = self._row_read(rid, table[src_col]) if 0 <= src_col < len(table) else UNSET
        if self._write(table[curr], state) and writes is not None:
            writes.append((curr, table[curr], state, "precopy"))

    def _prefill(self, truth: PrefixStates | None, tokens: list[int], start: State, num_computed: int,
                 num_drafts: int, checkpoint: int | None, sample: bool) -> tuple[State, State | None, list[int]]:
        """The PREFILL kernel from `start`: (the final state, drafts included; the state at the
        internal checkpoint, None without one; the greedy outputs, when `sample`)."""
        num_tokens = len(tokens)
        vocab = self.g.vocab_size
        at_checkpoint = None
        if checkpoint is not None:
            at_checkpoint = self._through(truth, tokens, start, num_computed, checkpoint - num_computed, num_drafts)
        if not num_drafts:  # the sampler reads the last position only
            final = self._through(truth, tokens, start, num_computed, num_tokens, 0)
            return final, at_checkpoint, [next_token(final, vocab)] if sample else []
        # ... and every draft position
        final = self._through(truth, tokens, start, num_computed, num_tokens - num_drafts - 1, num_drafts)
        outputs = []
        for tok in tokens[num_tokens - num_drafts - 1 :]:
            final = final.extend([tok])
            if sample:
                outputs.append(next_token(final, vocab))
        return final, at_checkpoint, outputs

    @staticmethod
    def _through(truth: PrefixStates | None, tokens: list[int], state: State, num_computed: int, count: int,
                 num_drafts: int) -> State:
        """`state` extended by the row's first `count` tokens (`tokens`, whose last `num_drafts`
        are drafts): O(1) from `truth` while they are real tokens."""
        if truth is not None and count <= len(tokens) - num_drafts:
            return truth.span(state, num_computed, num_computed + count)
        return state.extend(tokens[:count])

    def _checkpoint_position(self, num_computed: int, seq_len: int) -> int | None:
        """Where a prefill row's internal checkpoint lands, when vLLM's checkpoint rule places one
        in it (mixers with checkpoints only); None otherwise."""
        if self.g.checkpoint_alignment is None:
            return None
        position = get_mamba_prefill_checkpoint_position(
            seq_len, self.g.cache_hit_alignment_tokens, drop_eagle_block=self.g.drop_eagle_block
        )
        if not is_mamba_prefill_checkpoint_valid(
            query_start=num_computed, query_end=seq_len, checkpoint_position=position,
            hash_block_size=self.g.hash_block_size, mamba_block_size=self.g.block_size,
            checkpoint_alignment=self.g.checkpoint_alignment,
        ):
            return None
        return position

    def postprocess_spec(self, rid: str, table: list[int], num_computed: int, num_scheduled: int,
                         num_drafts: int, num_accepted: int) -> list[tuple[int, int, State, str]]:
        """After a forward in a spec-decode engine (every row, as the fused kernel does): move
        the state at a crossed block boundary into that boundary's own slot. With prefix caching
        off only the accepted-token count is kept (V1 `_update_states_after_model_execute`, V2
        `postprocess_state`)."""
        if not self.g.align:
            self._num_accepted[rid] = num_accepted
            return []
        bs = self.g.block_size
        src = self._prev_column[rid]
        resolved = num_computed + num_scheduled - num_drafts  # tokens whose state is in table[src]
        new_computed = resolved + num_accepted - 1
        aligned = new_computed // bs * bs
        self._num_accepted[rid] = num_accepted
        writes: list[tuple[int, int, State, str]] = []
        if aligned < resolved:
            return writes
        bias = aligned - resolved
        dest = aligned // bs - 1
        if dest == src:
            self._num_accepted[rid] = 1
            if bias == 0:
                return writes
        state = self.state_of(table[src + bias])
        if self._write(table[dest], state):
            writes.append((dest, table[dest], state, "postcopy"))
        return writes
