"""Hand a finding to vLLM's maintainers: a standalone pytest in the style of vLLM's
tests/v1/core (vLLM's own APIs only, no mambafuzz import) and the issue text.

The test's assertion is what the scheduler can see of the finding's kind, as the kind's oracle
registers it (`export` in mambafuzz.findings.ORACLES):
- `slot_hash`: every mamba block a step newly publishes claims a position where that
  request's state was actually left (a chunk end, a load, an internal checkpoint);
- `vllm_crash`: `schedule()` does not raise (`nocache-` crashes run with prefix caching off);
- the padded fresh prompt (`uninit_read:from-empty` on V1, `nocache_stale_read:…/prefill-kept-drafts`
  on V2 and Mamba2, formerly `stale_read:from-empty`): no request without computed tokens is
  scheduled with placeholder drafts.  What each model runner then does with that row differs
  (corpus/upstream/RUNNERS.md); the scheduler-side fact behind both is the padded row;
- `stall:step-bound` (`--style vllm` only): every request finishes within the harness's step bound.
A case filed under a kind with no assertion whose oracle `follows_from` another kind (an
`output_divergence` of a request that never finished) is exported as the finding it follows
from in its replay (`export_signature`, mambafuzz.findings.exported_finding).
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from pathlib import Path

from mambafuzz.findings import (
    EVERY_REQUEST_FINISHES,
    LONE_REQUEST_WITHIN_RESERVE,
    ORACLES,
    POOL_COUNTS_CONSISTENT,
    PUBLISHED_STATE_WRITTEN,
    V1_ACCEPTED_KEPT,
    export_assertion,
    exported_finding,
    kind_of,
)
from mambafuzz.model import runners as model_runners
from mambafuzz.model.architectures import DEFAULT_MODEL
from mambafuzz.model.scenario import ample_pool_blocks
from mambafuzz.store.corpus import Case
from mambafuzz.upstream.standalone_template import (
    POOL_AFTER_UPDATE,
    POOL_AT_END,
    RESERVE_AFTER_SCHEDULE,
    RESERVE_AFTER_UPDATE,
    RESERVE_SETUP,
    RESOURCE_HELPERS,
    TEMPLATE,
)
from mambafuzz.upstream.v1_template import V1_ACCEPTED_TEMPLATE
from mambafuzz.upstream.vllm_template import (
    ADMISSION_TEMPLATE,
    CHECKS,
    HEADER,
    HYBRID_IMPORTS,
    SCHEDULER_TEMPLATE,
    SLOT_HASH_IMPORTS,
    SLOT_HASH_TEMPLATE,
    STALL_CONNECTOR,
    STALL_CONNECTOR_CONFIG,
    STALL_IMPORTS,
    STALL_KV_OUTPUT,
    STALL_PRE_IMPORTS,
    STALL_TEMPLATE,
    STALL_WORKER,
    WHY,
)

TINY_CONFIG = Path(__file__).parent.parent / "tiny_model" / "config.json"
MAMBA_GROUPS = 3  # mamba KV-cache groups in a --style vllm test: the harness's tiny model has three

def _row_index() -> str:
    """ModelRunnerOutput's `req_id_to_index` argument as the exported tests pass it, only where the
    vLLM the export runs against still has the field (0.34 removed it): a test matches its vLLM."""
    from mambafuzz.sim.bridge.configs import ROW_INDEX_FIELD

    return "req_id_to_index={r: i for i, r in enumerate(ids)}, " if ROW_INDEX_FIELD else ""


STYLES = ("standalone", "vllm")


class ExportError(ValueError):
    """A case this exporter cannot express as a standalone vLLM test."""


def _refuse_connector_answers(s, style: str) -> None:
    """The connector's deferrals and failed sync loads are the harness's; neither exported test's
    connector answers None or fails a synchronous load yet."""
    if any(r.connector_defer for r in s.requests) or s.engine.connector_failed_sync_load:
        raise ExportError(f"--style {style} cannot express a connector that defers (requests[].connector_defer) or "
                          "fails a synchronous load (engine.connector_failed_sync_load) yet; replay it with mambafuzz repro")


def check_for(signature: str) -> str:
    """The test's assertion for `signature`: what its kind's oracle registers (mambafuzz.findings)."""
    check = export_assertion(signature)
    if check is None:
        raise ExportError(f"no scheduler-side assertion for {signature} yet")
    return check


def case_signature(case: Case) -> str:
    if case.scenario.engine.model != DEFAULT_MODEL:
        # the exported tests build the tiny model's groups (MAMBA_GROUPS, the standalone template's specs)
        raise ExportError(f"{case.path}: engine.model {case.scenario.engine.model} cannot be exported yet: the exported "
                          "tests build the tiny qwen3_next's KV-cache groups (minimize the case to the default model)")
    chained = next((i for i, r in enumerate(case.scenario.requests) if r.continues is not None), None)
    if chained is not None:
        raise ExportError(f"{case.path}: requests[{chained}] continues an earlier request, whose prompt an exported "
                          "test cannot write down before a run (not exported yet)")
    meta = case.extra.get("finding")
    if isinstance(meta, dict) and isinstance(meta.get("signature"), str):
        return meta["signature"]
    from mambafuzz.checks.pipeline import signature_of

    sig = signature_of(case.scenario, "fixed")
    if sig is None:
        raise ExportError(f"{case.path}: clean on the installed vLLM, nothing to export")
    return sig


def export_signature(case: Case) -> str:
    """The signature an exported test asserts: the case's own, or, where its kind has no assertion
    and its oracle `follows_from` other kinds, the finding it follows from when the case replays
    on the installed vLLM (the primary finding must still be the recorded one)."""
    sig = case_signature(case)
    oracle = ORACLES.get(kind_of(sig))
    if export_assertion(sig) is not None or oracle is None or not oracle.follows_from:
        return sig
    primary, exported = _replayed(case.scenario)
    if primary != sig:
        raise ExportError(f"{case.path}: replays as {primary or 'clean'}, not as its recorded {sig}")
    return exported


def _replayed(scenario) -> tuple[str | None, str | None]:
    """(primary signature, the exported finding's signature) of `scenario` on the installed vLLM."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError

    try:
        findings = evaluate(scenario, "fixed", efficiency=False).verdict.findings
    except ScenarioError:
        return None, None
    exported = exported_finding(findings)
    return (findings[0].signature, exported.signature) if exported else (None, None)


def _refuse_resets(case: Case) -> None:
    """Neither exported test replays the engine's reset_prefix_cache calls yet (Scenario.prefix_cache_resets)."""
    if case.scenario.prefix_cache_resets:
        raise ExportError(f"{case.path}: the exported test cannot replay prefix_cache_resets (the engine's "
                          "reset_prefix_cache calls) yet; replay it with mambafuzz repro")


def test_source(case: Case, title: str = "", why: str = "") -> str:
    """The exported test for `case` as Python source."""
    s = case.scenario
    _refuse_resets(case)
    sig = export_signature(case)
    if check_for(sig) == EVERY_REQUEST_FINISHES:  # its connector neither fails a load nor names the request
        raise ExportError(f"{case.path}: the standalone test cannot express {sig} yet (use --style vllm)")
    if check_for(sig) == V1_ACCEPTED_KEPT:
        return _v1_accepted_source(case, sig, title, why)
    _refuse_connector_answers(s, "standalone")
    if s.engine.async_scheduling is not False:
        s = _synchronous_twin(case, sig)
        why += "\nFound under async scheduling; it fails the same way with the synchronous Scheduler this test drives."
    if s.acceptance and any(s.acceptance):
        why += "\nThe scenario's draft acceptance is not replayed (no drafts are proposed)."
    engine = dataclasses.asdict(s.engine)
    engine.pop("runner", None)  # the model runner the kernel model mirrors: not a scheduler setting
    engine.pop("async_scheduling", None)  # synchronous, checked above
    engine.pop("max_model_len_slack", None)  # already folded into max_model_len below
    priority = engine.pop("scheduling_policy", "fcfs") == "priority"  # the test's SchedulerConfig says it
    if engine.pop("block_size_from_groups", False):  # left out when off, so earlier exports stay current
        raise ExportError(f"{case.path}: the standalone test cannot set cache_config.block_size below the mamba "
                          "block (engine.block_size_from_groups) yet; replay it with mambafuzz repro")
    # the scenario connector's save/load behaviours (EngineConfig.connector_*) are the harness's,
    # not a vLLM setting: left out at their defaults, so exports from before them stay current
    defaults = dataclasses.asdict(type(s.engine)())
    for name in [n for n in engine if n.startswith("connector_") and engine[n] == defaults[n]]:
        engine.pop(name)
    if ":nocache-" in sig:
        engine.update(enable_prefix_caching=False, prefix_match_unit=None, num_prefill_checkpoint_blocks=0,
                      prefill_checkpoint_alignment=None, enable_mamba_shared_prefix_checkpoint=False)
    requests = [{"id": rid, "arrival": r.arrival_step, "prompt": s.prompt_tokens(i), "max_tokens": r.max_tokens,
                 "external": r.external_tokens, "external_async": r.external_async, "abort": r.abort_step,
                 **({"priority": r.priority} if priority else {})} for i, (rid, r) in enumerate(zip(s.request_ids(), s.requests))]
    name = re.sub(r"\W+", "_", case.path.stem).strip("_").lower()
    return TEMPLATE.format(
        row_index=_row_index(),
        title=title or f"Regression test for {case.path.stem}", case_name=case.path.name, signature=sig,
        why=why.strip() + "\n" if why.strip() else "", engine=json.dumps(engine), requests=json.dumps(requests),
        num_blocks=s.engine.num_gpu_blocks or ample_pool_blocks(s), max_model_len=s.max_model_len(),
        max_steps=s.liveness_bound(), check=check_for(sig), model_config=json.dumps(json.loads(TINY_CONFIG.read_text())),
        test_name=name, **_resource_parts(check_for(sig)),
        # vLLM's priority policy, only where the case runs it (so every other export is what it was)
        scheduler_policy=', policy="priority"' if priority else "",
        request_priority=', priority=r["priority"]' if priority else "",
    )


def _resource_parts(check: str) -> dict[str, str]:
    """The standalone template's resource placeholders: the code a resource assertion needs, empty
    for every other check (so their exports are what they were)."""
    parts = dict.fromkeys(("resource_helpers", "resource_setup", "resource_after_schedule", "resource_after_update",
                           "resource_at_end"), "")
    if check == LONE_REQUEST_WITHIN_RESERVE:
        parts.update(resource_helpers=RESOURCE_HELPERS, resource_setup=RESERVE_SETUP,
                     resource_after_schedule=RESERVE_AFTER_SCHEDULE, resource_after_update=RESERVE_AFTER_UPDATE)
    elif check == POOL_COUNTS_CONSISTENT:
        parts.update(resource_helpers=RESOURCE_HELPERS, resource_after_update=POOL_AFTER_UPDATE,
                     resource_at_end=POOL_AT_END)
    return parts


def _synchronous_twin(case: Case, sig: str):
    """The case's scenario with vLLM's synchronous Scheduler, when it fails the same way there: the
    standalone test drives `schedule()` and `update_from_output()` one batch at a time."""
    from mambafuzz.model.scenario import with_scheduling

    twin = with_scheduling(case.scenario, "sync")
    if _replayed(twin)[1] != sig:
        raise ExportError(f"{case.path}: {sig} needs async scheduling, and the standalone test drives the "
                          "synchronous Scheduler only")
    return twin


def vllm_test_source(case: Case, title: str = "") -> str:
    """The exported test for `case` in vLLM's idiom (`--style vllm`): short, built on vLLM's own
    test helpers, so a maintainer can drop it into tests/v1/core/ (tests/v1/worker/ for V1's
    persistent batch) and read it in one screen."""
    s = case.scenario
    _refuse_resets(case)
    sig = export_signature(case)
    check = check_for(sig)
    name = re.sub(r"\W+", "_", case.path.stem).strip("_").lower()
    title = title or f"Regression test for {case.path.stem}"
    if check == V1_ACCEPTED_KEPT:
        body = _v1_accepted_source(case, sig, title, "").split('"""\n\nimport torch\n', 1)[1]
        return (f'{HEADER}"""{title} (Model Runner V1; for tests/v1/worker/).\n'
                f'Exported by mambafuzz from {case.path.name} ({sig}).\n"""\n\nimport pytest\nimport torch\n'
                + body.replace("\n\nMAMBA_BLOCK_SIZE", "\n\npytestmark = pytest.mark.cpu_test\n\nMAMBA_BLOCK_SIZE", 1))
    if check not in CHECKS and check not in (PUBLISHED_STATE_WRITTEN, EVERY_REQUEST_FINISHES):
        raise ExportError(f"--style vllm cannot express {sig} yet (use --style standalone)")
    _refuse_connector_answers(s, "vllm")
    if s.engine.scheduling_policy != "fcfs":
        raise ExportError(f"--style vllm cannot express engine.scheduling_policy {s.engine.scheduling_policy} yet: "
                          "create_scheduler builds an FCFS scheduler (use --style standalone)")
    if s.engine.async_scheduling is not False:  # create_scheduler builds the synchronous Scheduler
        s = _synchronous_twin(case, sig)
    if check in (PUBLISHED_STATE_WRITTEN, EVERY_REQUEST_FINISHES) or (check == "no_crash" and ":nocache-" not in sig):
        return _hybrid_source(case, s, sig, check, title, name)
    e = s.engine
    requests = {rid: (r.arrival_step, s.prompt_len(i), r.max_tokens)
                for i, (rid, r) in enumerate(zip(s.request_ids(), s.requests))}
    return SCHEDULER_TEMPLATE.format(
        row_index=_row_index(),
        title=title, why=WHY[check], case_name=case.path.name, signature=sig, test_name=name,
        num_spec=e.num_speculative_tokens if e.spec_method != "none" else 0,
        threshold=e.long_prefill_token_threshold, requests=requests, budget=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs, max_model_len=s.max_model_len(), max_steps=s.liveness_bound(),
        check=CHECKS[check])


def _hybrid_source(case: Case, s, sig: str, check: str, title: str, name: str) -> str:
    """A finding that needs mamba KV-cache groups: create_scheduler with a `scheduler_cls` that adds
    them (HYBRID_HEAD). Refused, in one line, where vLLM's helpers cannot state the scenario."""
    e, ids = s.engine, s.request_ids()
    why = f"--style vllm cannot express {sig} for {case.path.name}: "
    stall = check == EVERY_REQUEST_FINISHES  # MTP's drafts as create_scheduler's ngram drafts: see _stall_source
    if (e.spec_method != "none" and not stall) or not e.enable_prefix_caching or e.attn_block_size != e.mamba_block_size:
        raise ExportError(why + "create_scheduler's model (OPT) has no MTP layers and its attention block is the "
                          "mamba block; the case needs MTP, prefix caching off or another attention block "
                          "(use --style standalone)")
    external = {r.external_tokens for r in s.requests}
    admission = check == "no_crash"
    # the pool counts blocks per group (admission, liveness); one shows a hashed slot
    groups = MAMBA_GROUPS if admission or stall else 1
    filed = case_signature(case)
    fields = dict(
        title=title, case_name=case.path.name, test_name=name,
        signature=sig if sig == filed else f"{sig};\nfiled as {filed}, which follows from it", block_size=e.mamba_block_size,
        hash_block_size=e.prefix_match_unit or e.mamba_block_size, alignment=e.prefill_checkpoint_alignment,
        checkpoint_blocks=e.num_prefill_checkpoint_blocks, max_steps=s.liveness_bound(), mamba_extra="", pre_imports="",
        config_extra="" if e.prefix_cache_retention_interval is None else
        f"\n    kv_cache_config.prefix_cache_retention_interval = {e.prefix_cache_retention_interval}",
        groups_doc=f"+ {groups} mamba groups" if groups > 1 else "+ a mamba group",
        groups_code=f'[KVCacheGroupSpec([f"mamba.{{i}}"], mamba) for i in range({groups})]' if groups > 1
        else '[KVCacheGroupSpec(["mamba"], mamba)]')
    # create_scheduler's arguments where they differ from its defaults (its pool of 10000 blocks is ample)
    kwargs = {"num_blocks": e.num_gpu_blocks, "max_num_batched_tokens": e.max_num_batched_tokens,
              "max_num_seqs": e.max_num_seqs, "long_prefill_token_threshold": e.long_prefill_token_threshold,
              "max_model_len": s.max_model_len() if s.max_model_len() > e.max_num_batched_tokens else None,
              "num_speculative_tokens": e.num_speculative_tokens if e.uses_spec_decode else None}
    defaults = {"num_blocks": None, "max_num_batched_tokens": 8192, "max_num_seqs": 16,
                "long_prefill_token_threshold": 0, "max_model_len": None, "num_speculative_tokens": None}
    args = [f"{k}={v}" for k, v in kwargs.items() if v != defaults[k]]
    if admission:
        args.append(f"use_kv_connector=mock_kv(matched_tokens={max(external)}, is_async=False)")
    if stall and max(external):  # mock_kv's config, with its connector class replaced by ScenarioKV
        args.append("use_kv_connector=mock_kv(matched_tokens=0, is_async=False)")
    indent = " " * len("    scheduler = create_scheduler(")  # the arguments line up under the first
    fields["kwargs"] = ("\n" + indent).join(textwrap.wrap(", ".join(args), 100 - len(indent),
                                                         initial_indent=" " * 31, break_long_words=False,
                                                         break_on_hyphens=False)).lstrip()
    if admission:
        lens = {s.prompt_len(i) for i in range(len(ids))}
        if (len(lens) > 1 or len(external) > 1 or not max(external) or any(r.external_async for r in s.requests)
                or s.prefixes or any(r.arrival_step or r.abort_step is not None for r in s.requests)):
            raise ExportError(why + "the short admission test admits requests of one prompt length with one sync "
                              "connector token count, distinct prompts, all at step 0 (use --style standalone)")
        return ADMISSION_TEMPLATE.format(
        row_index=_row_index(),
            why=WHY["no_crash_admission"], imports=HYBRID_IMPORTS, extra_helpers=", mock_kv", constants="",
            num_requests=len(ids),
            prompt_len=lens.pop(), external=max(external), **fields)
    if stall:
        _check_prompt_sharing(s, fields["hash_block_size"], why)
        return _stall_source(s, fields, why)
    if max(external):
        raise ExportError(why + "vLLM's mock_kv connector is no SupportsHMA connector: a request that finishes with "
                          "it under a hybrid KV cache trips request_finished's single-group assert "
                          "(use --style standalone)")
    _check_prompt_sharing(s, fields["hash_block_size"], why)
    return SLOT_HASH_TEMPLATE.format(
        row_index=_row_index(),
        why=WHY[check], imports=SLOT_HASH_IMPORTS, extra_helpers="", constants=_requests_line(s), **fields)


def _requests_line(s) -> str:
    table = {rid: (r.arrival_step, s.prompt_len(i), r.max_tokens) for i, (rid, r) in enumerate(zip(s.request_ids(), s.requests))}
    return f"REQUESTS = {table!r}  # id -> (arrival step, prompt length, max tokens)\n"


def _check_prompt_sharing(s, unit: int, why: str) -> None:
    """create_requests makes every prompt one token repeated: the scenario's prompts must share
    what they share in whole hash blocks, and nothing more."""
    ids = s.request_ids()
    for i in range(len(ids)):
        for j in range(i):
            a, b = s.prompt_tokens(i), s.prompt_tokens(j)
            common = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            if common // unit != min(len(a), len(b)) // unit:
                raise ExportError(why + f"{ids[j]} and {ids[i]} share {common} leading tokens, and "
                                  "create_requests' prompts would share more (use --style standalone)")


def _stall_source(s, fields: dict, why: str) -> str:
    """A stall: the requests run for the harness's step bound and must all finish. Drafts are
    create_scheduler's (ngram) with the case's count, which is what the scheduler reserves blocks
    and mamba speculative blocks for; MTP's lookahead slots and EAGLE's block drop are not stated
    (tests/upstream/test_export.py checks the exported case still fails). A connector case gets
    ScenarioKV and the test as its worker (STALL_TEMPLATE)."""
    e = s.engine
    if any(r.abort_step is not None for r in s.requests):
        raise ExportError(why + "the short stall test aborts no request (not exported yet)")
    if e.uses_spec_decode:
        fields["mamba_extra"] = f",\n                      num_speculative_blocks={e.num_speculative_tokens}"
    constants = _requests_line(s)
    connector = dict(loads_init="", worker="", kv_output="", imports=HYBRID_IMPORTS
                     + "from vllm.v1.outputs import ModelRunnerOutput\n")
    if any(r.external_tokens for r in s.requests):
        if e.connector_save or e.connector_recv_steps or e.connector_load_source != "truth" or e.connector_divergent_hits:
            raise ExportError(why + "the short stall test's connector loads what is asked, ends each load in the "
                              "step that starts it (connector_recv_steps 0) and saves nothing (not exported yet)")
        external = {rid: (r.external_tokens, r.external_async) for rid, r in zip(s.request_ids(), s.requests)
                    if r.external_tokens}
        constants += (f"EXTERNAL = {external!r}  # id -> (connector hit, async load)\n"
                      f"FAILED_LOAD = {e.connector_failed_load}  # the n-th async load fails (0: none)\n"
                      + STALL_CONNECTOR)
        fields["config_extra"] += STALL_CONNECTOR_CONFIG.format(policy=e.connector_failure_policy)
        connector.update(loads_init="\n    num_loads = 0  # async loads started", worker=STALL_WORKER,
                         kv_output=STALL_KV_OUTPUT, imports=STALL_IMPORTS)
        fields["pre_imports"] = STALL_PRE_IMPORTS
    fields["extra_helpers"] = ", mock_kv" if connector["worker"] else ""
    return STALL_TEMPLATE.format(why=WHY[EVERY_REQUEST_FINISHES], row_index=_row_index(), constants=constants, **connector, **fields)


def _v1_accepted_source(case: Case, sig: str, title: str, why: str) -> str:
    """A V1 accepted-count finding as a test of V1's persistent batch: the request the finding
    names sits out one step beside the case's other requests."""
    s = case.scenario
    ids = s.request_ids()
    meta = case.extra.get("finding") if isinstance(case.extra.get("finding"), dict) else {}
    named = re.search(r"\b(" + "|".join(map(re.escape, ids)) + r") ran\b", str(meta.get("message", "")))
    if named is None:
        raise ExportError(f"{case.path}: the finding's message names no request of the case")
    return V1_ACCEPTED_TEMPLATE.format(
        title=title or f"Regression test for {case.path.stem}", case_name=case.path.name, signature=sig,
        why=why.strip() + "\n" if why.strip() else "", block_size=s.engine.mamba_block_size,
        num_spec=s.engine.num_speculative_tokens, max_model_len=s.max_model_len(),
        prompt_lens={rid: s.prompt_len(i) for i, rid in enumerate(ids)}, skipping=named.group(1),
        test_name=re.sub(r"\W+", "_", case.path.stem).strip("_").lower(),
    )


def finding_runner(case: Case) -> str | None:
    """The model runner the finding was filed on (None: the scenario's own)."""
    meta = case.extra.get("finding")
    runner = meta.get("runner") if isinstance(meta, dict) else None
    return runner if isinstance(runner, str) else None


def fix_dir(case: Case) -> Path | None:
    """The candidate fix beside a case (corpus/upstream/<finding>/fix.py), if any."""
    d = case.path.parent
    return d if (d / "fix.py").is_file() else None


FIX_SECTION = "## Candidate fix (`fix.py`)"
STATUS_SECTION = "Tracker status and main status"
COST_SECTION = "### Cost"


def finding_analysis(directory: Path | None) -> tuple[str, str]:
    """(title, body) of the finding's README.md, without its heading and its fix section."""
    readme = directory / "README.md" if directory else None
    if readme is None or not readme.is_file():
        return "", ""
    text = readme.read_text().split(FIX_SECTION)[0]
    lines = text.splitlines()
    title = lines[0].lstrip("# ").removeprefix("Upstream behaviour: ") if lines else ""
    return title[:1].upper() + title[1:], "\n".join(lines[1:]).strip()


def _recorded_cost(directory: Path) -> str | None:
    """The cost section the finding's README already records (bench/fix_cost.py), if any."""
    text = (directory / "README.md").read_text() if (directory / "README.md").is_file() else ""
    if COST_SECTION not in text:
        return None
    return re.split(r"^## ", text.split(COST_SECTION, 1)[1].split("\n", 1)[1], maxsplit=1, flags=re.M)[0].strip()


def _split_status(body: str) -> tuple[str, str]:
    """(the README's tracker-and-main status section, the rest): the status leads the issue as its
    'related issues and PRs', so a maintainer sees what upstream already has first."""
    m = re.search(r"^## " + STATUS_SECTION + r"[^\n]*\n(.*?)(?=^## |\Z)", body, flags=re.M | re.S)
    return (m.group(1).strip(), body[:m.start()] + body[m.end():]) if m else ("", body)


def _collapsed(summary: str, text: str) -> str:
    """A GitHub <details> block: the evidence a maintainer opens when the screen above convinced them."""
    return f"<details><summary>{summary}</summary>\n\n{text.strip()}\n\n</details>\n"


def _lead(status: str) -> str:
    """The tracker status's verdict: its leading bold sentence (the status sections open with one)."""
    m = re.match(r"\s*\*\*(.+?)\*\*", status, flags=re.S)
    return " ".join(m.group(1).split()) if m else ""


def _summary(reproducer: str, body: str) -> str:
    """What goes wrong, in a few lines: the exported test's own explanation (its docstring after the
    title), else the analysis's first paragraph of prose."""
    doc = re.search(r'^"""(.*?)"""', reproducer, flags=re.M | re.S)
    if doc:
        lines = [ln for ln in doc.group(1).strip().splitlines()[1:] if ln.strip() and not ln.startswith("Exported by")]
        if lines:
            return " ".join(" ".join(lines).split())
    for para in re.split(r"\n\s*\n", body):
        para = para.strip()
        if para and not para.startswith(("#", "```", "|", "-")):
            return " ".join(para.split())
    return "(no analysis on file)"


def report_text(case: Case, cost_rows: int = 30) -> str:
    """The issue text for `case`: what happens, a minimal repro, the evidence, the candidate
    fix and its cost table."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.sim import patching
    from mambafuzz.tools.fix_cost import cost_table

    directory = fix_dir(case)
    title, body = finding_analysis(directory)
    sig = case_signature(case)
    runner = finding_runner(case)
    before = evaluate(case.scenario, "fixed", efficiency=False, runner=runner).verdict
    checked_033 = "0.33.0 tree" in body  # the README says the short test was run on the 0.33.0 release tree
    related, body = _split_status(body)
    body = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", body, flags=re.M)  # under this report's headings
    try:  # the short test in vLLM's idiom where there is one; the standalone test otherwise
        reproducer, style = vllm_test_source(case, title), "vllm"
    except ExportError:
        reproducer, style = test_source(case, title), "standalone"
    from mambafuzz.sim.bridge.vllm_compat.about import vllm_version  # the version a finding records

    # What a maintainer sees on one screen: vLLM's bug template (environment, the bug), the short test,
    # expected against actual. The evidence (tracker search, mechanism, fix, cost) follows collapsed.
    parts = [f"# [Bug]: {title or case.path.stem}", "", "## Your current environment", "",
             f"vLLM {vllm_version()}{' (also checked: the 0.33.0 release tree)' if checked_033 else ''}, "
             "Python 3.11, scheduler and "
             "KV-cache manager driven on CPU; "
             + (f"{model_runners.get(runner).title}." if runner else "both model runners unless said otherwise."), "",
             "## Describe the bug", "", _summary(reproducer, body), "",
             f"Related upstream: {_lead(related) or '(none found)'} (details below)", "",
             "## Minimal reproducer", "",
             f"`mambafuzz export-test --style {style} {case.path} -o FILE` writes it; it fails on the unmodified "
             "vLLM and passes with the candidate fix:", "",
             "```python", reproducer.rstrip(), "```", "",
             "## Expected and actual", "", f"- signature `{sig}`" + (f" (Model Runner {runner.upper()})" if runner else "")]
    parts += [f"- `{f.kind}`: {f.message}" for f in before.findings]
    if directory is not None:
        patches = patching.load_patches(str(directory / "fix.py"))
        after = evaluate(case.scenario, "fixed", efficiency=False, patches=patches, runner=runner).verdict
        parts += [f"- with the candidate fix: {'clean' if after.clean else after.primary.message}"]
    parts += ["", "## Evidence", "", _collapsed("Related issues and PRs; status on vLLM main", related.strip() or "(none found)"),
              _collapsed("The mechanism in vLLM's code (the full analysis; replay any case with `mambafuzz repro "
                         "FILE --trace`)", body.strip() or "(no analysis on file)")]
    if directory is not None:
        parts += [_collapsed("Candidate fix", "Applied to the installed vLLM by mambafuzz (`--patch`); as a change to "
                             "vLLM it is the edit or wrap below.\n\n```python\n" + (directory / "fix.py").read_text().rstrip()
                             + "\n```"),
                  _collapsed("Cost of the fix", _recorded_cost(directory) or
                             "vLLM with and without the fix (forward steps, hashed snapshots, prefix-hit tokens summed; "
                             "`worse` counts scenarios made worse; crashed runs excluded):\n\n" + cost_table(patches, cost_rows))]
    return "\n".join(parts) + "\n"
