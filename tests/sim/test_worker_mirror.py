"""The shared step pieces: the worker mirror over several mamba groups, the block auditor, and
the audit plugin's import staying free of vLLM."""

import subprocess
import sys
from types import SimpleNamespace

from mambafuzz.checks.oracle import slot_hash_poisoned
from mambafuzz.sim.engine.cache_audit import BlockAuditor
from mambafuzz.sim.engine.hash_book import HashBook
from mambafuzz.sim.state import PrefixStates
from mambafuzz.sim.worker.kernel_model import KernelGeometry, KernelModel
from mambafuzz.sim.worker.worker_mirror import WorkerMirror

TRUTH = PrefixStates(list(range(1, 40)))


def model(block_size: int) -> KernelModel:
    return KernelModel(KernelGeometry(block_size=block_size, hash_block_size=4, checkpoint_alignment=None,
                                      cache_hit_alignment_tokens=block_size, drop_eagle_block=False,
                                      null_block_id=0, vocab_size=1024, spec_engine=True,
                                      num_speculative_tokens=2))


def output(copies=(), zero=(), finished=(), scheduled=("r",)):
    """The SchedulerOutput fields the mirror reads."""
    return SimpleNamespace(finished_req_ids=set(finished), preempted_req_ids=None,
                           num_scheduled_tokens=dict.fromkeys(scheduled, 1),
                           scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=None), new_block_ids_to_zero=list(zero),
                           kv_cache_block_copies=[SimpleNamespace(src_block_id=s, dst_block_id=d) for s, d in copies])


def drive(mirror: WorkerMirror, tables: list[list[int]]) -> list:
    """Three steps of one request (a chunk, a chunk, a spec-decode row) with a load, a zeroed
    block and a copy (block ids of the one pool every group shares)."""
    seen = [mirror.before_forward(output(zero=[11]))]
    seen.append(mirror.load(tables, 4, TRUTH.at(4)))
    mirror.begin_step({"r": 6})
    seen.append(mirror.run_row("r", tables, 4, 6, [], TRUTH, 20, 20))
    seen.append(mirror.run_row("r", tables, 10, 10, [], TRUTH, 20, 20))
    seen.append(mirror.before_forward(output(copies=[(11, 99)])))
    seen.append(mirror.run_row("r", tables, 20, 3, [7, 8], TRUTH, 20, 20))
    seen.append(mirror.postprocess("r", tables, 20, 3, 2, 2))
    seen.append(mirror.begin_step({}))  # V1 forgets the unscheduled row's accepted count
    return seen


def test_a_mirror_over_two_groups_does_what_one_mirror_per_group_does():
    tables = [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23, 24]]  # block sizes 4 and 8
    both = WorkerMirror([model(4), model(8)], spec_engine=True)
    got = drive(both, tables)
    alone = [WorkerMirror([model(size)], spec_engine=True) for size in (4, 8)]
    first = drive(alone[0], tables[:1])
    drive(alone[1], tables[1:])
    assert got == first  # the first model's results come back
    assert [m.held for m in both.models] == [m.first.held for m in alone]
    assert both.models[1].held  # the second group was written too
    assert first[4] == [(99, TRUTH.at(4))]  # the copy's destination, as held right after it
    assert first[-1] == ["r"]



def test_groups_of_one_geometry_run_in_lockstep_as_each_would_alone():
    """Groups with the first's geometry, runner and mixer follow its counts and run their rows
    with its own (KernelModel.run_rows); a group whose block holds a wrong state still reads,
    computes and writes its own states."""
    tables = [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23, 24, 25, 26, 27]]
    both = WorkerMirror([model(4), model(4)], spec_engine=True)
    alone = [WorkerMirror([model(4)], spec_engine=True) for _ in tables]

    def steps(mirror: WorkerMirror, groups: list[list[int]], wrong: KernelModel) -> list:
        seen = [mirror.load(groups, 4, TRUTH.at(4))]
        wrong.load_external(tables[1], 4, TRUTH.at(3))  # the second group's block 21 holds a wrong state
        mirror.begin_step({"r": 6})
        for start, n, drafts in ((4, 6, []), (10, 10, []), (20, 3, [7, 8])):
            spec_row, row = mirror.run_row("r", groups, start, n, drafts, TRUTH, 20, 20)
            seen.append((spec_row, row, list(mirror.rest_reads)))
        seen.append(mirror.postprocess("r", groups, 20, 3, 2, 2))
        seen.append(mirror.begin_step({}))
        return seen

    got = steps(both, tables, both.models[1])
    first = steps(alone[0], tables[:1], model(4))
    second = steps(alone[1], tables[1:], alone[1].first)
    assert [step[:2] for step in got[1:4]] == [step[:2] for step in first[1:4]]
    assert [step[2] for step in got[1:4]] == [[row[:3]] for _, row, _ in second[1:4]]  # what each row read
    assert got[1][2][0].read_state == TRUTH.at(3) != got[1][1].read_state  # the second group read its own
    assert [m.held for m in both.models] == [alone[0].first.held, alone[1].first.held]
    assert both.models[1].worker_state("r") == alone[1].first.worker_state("r")
    assert got[-2:] == first[-2:]

def test_auditor_describes_what_the_hash_claims_and_the_block_holds():
    book = HashBook(4)
    book.learn("r0", [b"a", b"b"], TRUTH)
    m = model(4)
    m.load_external([5, 6], 8, TRUTH.at(8))
    auditor = BlockAuditor(book, m, 4)
    right = auditor.entry(b"b", 6, True, 8, True)
    assert (right.claimed_by, right.column, right.held) == ("r0", 1, TRUTH.at(8)) and not slot_hash_poisoned(right)
    assert slot_hash_poisoned(auditor.entry(b"b", 6, True, 4, True))  # records a count its hash does not cover
    assert slot_hash_poisoned(auditor.entry(b"a", 6, False, None, True))  # holds state@8, claims state@4
    assert not auditor.knows(b"c") and slot_hash_poisoned(auditor.entry(b"c", 6, False, None, True))


def test_the_hash_book_learns_nothing_from_a_request_with_no_more_hashes_than_it_learned():
    """The harness skips `learn` while a request has no more hashes than `HashBook.learned` says:
    such a call must change nothing, whatever its truth covers, and a call with more hashes must
    learn them once its truth covers them."""
    import random

    rng = random.Random(3)
    book = HashBook(4)
    hashes = {rid: [bytes([i, j]) for j in range(9)] for i, rid in enumerate(["r0", "r1", "r2"])}
    for _ in range(300):
        rid = rng.choice(list(hashes))
        have, covered = rng.randrange(10), PrefixStates(list(range(1, 1 + rng.randrange(40))))
        before = (dict(book.truth), dict(book.learned))
        book.learn(rid, hashes[rid][:have], covered)
        if have <= before[1].get(rid, 0):
            assert (book.truth, book.learned) == before
        else:
            assert book.learned.get(rid, 0) == max(before[1].get(rid, 0), min(have, len(covered.tokens) // 4))


def test_importing_the_audit_plugin_imports_no_vllm():
    """The plugin is loaded by every vLLM process: its import may not pull vLLM or the bridge's
    module-level patches in; the step pieces load on the first audited step."""
    code = ("import sys; import mambafuzz.engine_tier.audit_plugin, mambafuzz.sim.worker.worker_mirror, mambafuzz.sim.engine.cache_audit; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm' or m in ('mambafuzz.sim.bridge.configs', 'mambafuzz.sim.bridge.scheduler_session')"
            " or m == 'mambafuzz.sim.worker.kernel_model'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_audit_plugin_judges_a_publication_with_the_oracles_predicate():
    """A live publication whose block holds the claimed state but records a token count its hash
    does not cover is poisoned, as the oracle's slot_hash check says; a hash the bounded book
    no longer knows is counted, not judged."""
    from mambafuzz.engine_tier import audit_plugin
    from mambafuzz.sim.bridge.vllm_compat.api import make_block_hash_with_group_id

    book = HashBook(4)
    book.learn("r0", [b"a" * 32, b"b" * 32], TRUTH)
    m = model(4)
    m.load_external([5, 6], 8, TRUTH.at(8))
    key, unknown = make_block_hash_with_group_id(b"b" * 32, 1), make_block_hash_with_group_id(b"c" * 32, 1)
    blocks = {6: SimpleNamespace(block_hash=key, block_hash_num_tokens=4),
              7: SimpleNamespace(block_hash=unknown, block_hash_num_tokens=12)}
    pool = SimpleNamespace(blocks=blocks, cached_block_hash_to_block=SimpleNamespace(contain=lambda k, b: True))
    sched = SimpleNamespace(kv_cache_manager=SimpleNamespace(block_pool=pool))
    audit = audit_plugin.SchedulerAudit({1: m}, 4, 100, False, 0, book, WorkerMirror([m], False),
                                        {1: BlockAuditor(book, m, 4)})
    audit.pending = [audit_plugin._Pending(key, 6), audit_plugin._Pending(unknown, 7)]
    audit_plugin.judge_blocks(sched, audit)
    assert (audit.checked, audit.unjudged) == (1, 1)
    [bad] = audit.poisoned
    assert (bad.request_id, bad.column, bad.claimed_tokens, bad.recorded_tokens) == ("r0", 1, 8, 4)
    assert "records block_hash_num_tokens=4" in bad.describe()


def test_cow_copies_gather_every_source_before_writing_any():
    """The worker copies CoW blocks in one gather and one scatter (`blocks[dst] = blocks[src]`):
    a copy whose source is another copy's destination copies that block's old state."""
    mirror = WorkerMirror([model(4)], spec_engine=False)
    m = mirror.first
    m.held.update({1: TRUTH.at(4), 2: TRUTH.at(8)})
    landed = mirror.before_forward(output(copies=[(1, 2), (2, 3)]))
    assert m.held[3] == TRUTH.at(8)  # block 2 as the forward began, not block 1's state copied into it
    assert m.held[2] == TRUTH.at(4)
    assert landed == [(2, TRUTH.at(4)), (3, TRUTH.at(8))]


def test_a_row_reads_its_block_as_the_forward_began_not_another_rows_write():
    """Rows of one forward read the states their blocks held when it began (the mixers gather
    every initial state before scattering any final one): a request that reads a block another
    request writes in the same forward reads the old state; in the next forward, the new one."""
    mirror = WorkerMirror([model(4)], spec_engine=False)
    mirror.before_forward(output(scheduled=("a", "b")))
    _, a = mirror.run_row("a", [[5, 6]], 0, 4, [], TRUTH, 20, 20)
    assert a.writes == [(0, 5, TRUTH.at(4), "chunk-end")]
    _, b = mirror.run_row("b", [[5, 7]], 4, 4, [], TRUTH, 20, 20)  # copies block 5 into 7, then reads 7
    assert b.read_state != TRUTH.at(4)  # block 5 as the forward began: never written
    assert mirror.first.held[5] == TRUTH.at(4)  # a's write stands
    mirror.before_forward(output(scheduled=("c",)))  # one row: nothing to track
    _, c = mirror.run_row("c", [[5, 8]], 4, 4, [], TRUTH, 20, 20)
    assert c.read_state == TRUTH.at(4)
