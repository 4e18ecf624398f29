"""The conformance driver runs continuations: each prompt is built at arrival from the session."""

from mambafuzz.search.startup import prepare_process

prepare_process(conform=True)  # this process's start-up step: Triton's CPU shim, before the conformance tier is imported

from mambafuzz.conform.drive import drive  # noqa: E402
from mambafuzz.model.scenario import with_scheduling  # noqa: E402
from tests.sim.test_harness_continuations import turns  # noqa: E402


def test_the_conformance_driver_builds_continuation_prompts():
    s = with_scheduling(turns(), "sync")
    prompts = {r.req_id: r.num_prompt_tokens for step in drive(s, ("v2",)) for r in step.input.rows}
    assert prompts == {"r0": 100, "r1": 100 + 60 + 20, "r2": 128}  # the constant worker still generates 60
