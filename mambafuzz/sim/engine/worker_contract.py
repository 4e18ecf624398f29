"""The contract between vLLM's scheduler and its worker, each rule by name: a SchedulerOutput that
breaks one is a finding located at the scheduler's output (a GPU worker would run it on garbage),
checked before the harness uses the row. Beside it, how an exception is told apart: raised in vLLM
(a `vllm_crash`), or in mambafuzz's own simulation (a tool failure, `HarnessError`). The harness
and the connector's worker side (`connector.ConnectorWorker`) both raise these."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

from mambafuzz.exit_codes import ToolError, one_line
from mambafuzz.sim.trace import Crash


def vllm_frame(exc: BaseException) -> str:
    """Where in vLLM `exc` was raised: its innermost vLLM frame ("outside-vllm" when none);
    the harness and the engine replay locate a crash by it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/vllm/" in f.filename]
    if not frames:
        return "outside-vllm"
    f = frames[-1]
    path = f.filename[f.filename.rfind("/vllm/") + 1 :]
    return f"{path}:{f.lineno} in {f.name}"


class SchedulerContractError(Exception):
    """vLLM's SchedulerOutput asks the worker for something no worker can run. A finding located
    at the scheduler's output, with the broken rule (`contract`) as its mechanism, not a tool
    failure: a GPU worker would run it on garbage. Checked before the harness uses the state."""

    location = "scheduler-output"

    def __init__(self, contract: str, message: str):
        super().__init__(message)
        self.contract = contract

    def crash(self, step: int) -> Crash:
        return Crash("SchedulerContract", str(self), self.location, step, self.contract)


SCHEDULER_OUTPUT = SchedulerContractError.location
STALE_OUTPUT_CHANGES_NOTHING = "stale-output-changes-nothing"  # the rule a StaleDeliveryError breaks


class StaleDeliveryError(SchedulerContractError):
    """update_from_output applied a batch's output to a request preempted after that batch was
    scheduled, and moved its counters: the stale share must change nothing (AsyncScheduler
    `_update_request_with_output(is_stale=True)`, Scheduler.update_from_output's stale branch)."""

    location = "stale-delivery"


# vLLM's contract for one scheduled row, each rule by name (the finding's mechanism):
ROW_WITHIN_TOKENS = "row-within-tokens"  # the row covers tokens its request has
ROW_VERIFIES_DRAFTS = "row-verifies-drafts"  # drafts follow at least one real token, whose output checks the first
ROW_STATE_IN_TABLE = "row-state-in-table"  # the mamba block table holds the block the row's state goes to
ROW_COUNTS_ARE_INTEGERS = "row-counts-are-integers"  # token counts and positions are ints, as the worker indexes with them
# A request whose KV-connector lookup answered None (`get_num_new_matched_tokens`: ask again later) is
# skipped for the rest of that schedule(): not asked again, not scheduled, and it holds no blocks (the
# skip comes before any allocation, scheduler.py:986-990; skip_request, 903-910, re-queues it, 1394-1395)
DEFERRED_REQUEST_SKIPPED = "deferred-request-skipped"
# A boundary-state hand-off names a boundary on the hash grid: Mooncake's store worker asserts it
# (mooncake/store/worker.py:594-598, `_boundary_puts`) before keying the block by that prefix's hash.
OFFLOAD_ON_HASH_GRID = "offload-on-hash-grid"
# schedule() hands the engine core a SchedulerOutput (EngineCore.step passes it to the executor as is)
SCHEDULE_RETURNS_OUTPUT = "schedule-returns-output"
# A row uses the blocks SchedulerOutput told the worker (worker_tables.WorkerTables). Where the manager's table
# holds a different real block at a column the row reads or writes, the scheduler changed a running request's
# table without telling (vLLM's worker only appends: `_update_states`, gpu_model_runner.py:1417-1428). The
# manager may null a block without telling: align mode nulls skipped states in place (`remove_skipped_blocks`)
# and moves scratch blocks to a later column (`_relocate_speculative_block`, single_type_kv_cache_manager.py:
# 1908-1917, asserting the block is the request's alone and unhashed). A row that writes through such a stale
# column breaks the rule only when the block is no longer the request's own scratch (free, shared, cached or
# another's); a read through it is judged by the state oracles, as the kernel model reads the told block.
ROW_BLOCKS_AS_TOLD = "row-blocks-as-told"


def check_told_blocks(rid: str, told: Sequence[list[int]], held: Sequence[Sequence[Any]], read_column: int,
                      writes: Sequence[tuple], rest_reads: Sequence[Any], null_block: int,
                      own_scratch: Any) -> None:
    """Raise SchedulerContractError when a column a row read (`read_column`, each other group's in
    `rest_reads`) or wrote (the first two fields of each of `writes`: column, block) holds another
    block in the worker's table (`told`) than in the manager's (`held`: each group's KVCacheBlock
    list, vLLM's own: `SchedulerSession.mamba_block_lists`), by ROW_BLOCKS_AS_TOLD's rule.
    `own_scratch(rid, block)` says whether the request alone holds the block, unhashed. It runs
    per row, so it reads the few columns a row uses in place: align mode nulls skipped blocks in
    the manager's table only, and the two tables differ on most rows."""
    columns = {read_column}
    for write in writes:
        columns.add(write[0])
    for read in rest_reads:
        columns.add(read.read_column)
    if len(columns) > 1:
        columns = sorted(columns)
    for g, (worker, manager) in enumerate(zip(told, held)):
        nw, nm = len(worker), len(manager)
        for c in columns:
            if c < 0:
                continue
            w = worker[c] if c < nw else None
            m = manager[c].block_id if c < nm else None
            if w == m:
                continue
            written = any(x[0] == c for x in writes)
            if m == null_block and w is not None:
                if not written or own_scratch(rid, w):
                    continue
                why = "which the scheduler nulled there and no longer holds as the request's own scratch block"
            else:
                why = "but the scheduler's table holds " + ("no block" if m is None else f"block {m}")
            raise SchedulerContractError(ROW_BLOCKS_AS_TOLD, (
                f"{rid}'s row {'writes' if written else 'reads'} mamba block-table column {c} (group {g}): "
                f"the worker was told block {w} (SchedulerOutput), {why}"))


def check_row(rid: str, start: int, num_tokens: int, num_drafts: int, request_tokens: int,
              table: list[int], block_size: int | None) -> None:
    """Raise SchedulerContractError when a row breaks vLLM's contract with its worker, before
    the harness uses the row. A negative count fails the first rule. A row of drafts alone (a
    rollback that left too many tokens computed) made the harness index past the row's outputs,
    and a table without the row's state block (column cdiv(start + num_tokens, block_size) - 1 in
    align mode, 0 with `block_size` None: no prefix caching) past the table: tool failures on a
    vLLM bug.  So did a token count that is not an int (a `/` for a `//` in the split): the worker
    slices its inputs with it."""
    if type(start) is not int or type(num_tokens) is not int:
        raise SchedulerContractError(ROW_COUNTS_ARE_INTEGERS, f"{rid} is scheduled for {num_tokens!r} token(s) from "
                                     f"position {start!r}: the worker indexes its inputs with both")
    end = start + num_tokens - num_drafts
    if not 0 <= start <= end <= request_tokens:
        raise SchedulerContractError(ROW_WITHIN_TOKENS, f"{rid} is scheduled for tokens {start}..{end} "
                                     f"(+{num_drafts} drafts) but has {request_tokens} tokens")
    if num_drafts and start == end:
        raise SchedulerContractError(ROW_VERIFIES_DRAFTS, f"{rid} is scheduled for {num_drafts} draft(s) at token "
                                     f"{start} and no token of its own to verify them with")
    column = -(-(start + num_tokens) // block_size) - 1 if block_size else 0
    if column >= len(table):
        raise SchedulerContractError(ROW_STATE_IN_TABLE, f"{rid} is scheduled up to token {start + num_tokens} (state "
                                     f"block column {column}) but its mamba block table has {len(table)} block(s)")


class HarnessError(ToolError):
    """mambafuzz's own simulation raised, with no vLLM frame on the stack: a tool failure, never a
    `vllm_crash` finding.  (It may still point at a vLLM inconsistency, e.g. a block table too
    short for the tokens scheduled; the input is kept so a person can tell.)"""


def crash_or_tool_error(exc: Exception, step: int) -> Crash:
    """A vLLM crash located by vLLM's innermost frame; our own exception is a HarnessError."""
    where = vllm_frame(exc)
    if where == "outside-vllm":
        raise HarnessError(f"the harness itself raised {one_line(exc, where=True)} (step {step}); "
                           "a tool failure, not a vLLM crash") from exc
    return Crash(type(exc).__name__, (str(exc).splitlines() or [""])[0], where, step)
