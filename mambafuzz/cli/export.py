"""`mambafuzz export-test` and `mambafuzz export-report`: hand a finding to vLLM's maintainers
(the test and the issue text are written by mambafuzz.upstream.export).

Registered by `mambafuzz.cli.main` through `add_export_commands(sub)`."""

from __future__ import annotations

from typing import Any

from mambafuzz.exit_codes import UsageError
from mambafuzz.store.corpus import Case
from mambafuzz.upstream.export import (
    STYLES,
    ExportError,
    finding_analysis,
    fix_dir,
    report_text,
    test_source,
    vllm_test_source,
)


def add_export_commands(sub: Any) -> None:
    t = sub.add_parser("export-test", help="write a standalone vLLM-style pytest for a finding",
                       description="Write a pytest that uses only vLLM's APIs (no mambafuzz import), fails on the "
                                   "installed vLLM and passes with the finding's candidate fix applied (check "
                                   "with: MAMBAFUZZ_PATCHES=fix.py python -m pytest -p mambafuzz.upstream.fix_plugin FILE).")
    t.add_argument("case", metavar="CASE")
    t.add_argument("-o", "--output", metavar="FILE.py", required=True)
    t.add_argument("--style", choices=STYLES, default="standalone",
                   help="standalone: vLLM APIs only, runs anywhere (default); vllm: a short test for vLLM's "
                        "tests/v1/core/ built on its test helpers (create_scheduler, create_requests)")
    t.set_defaults(handler=_cmd_export_test)
    r = sub.add_parser("export-report", help="write the issue text for a finding",
                       description="What happens, a minimal repro, the evidence, the candidate fix and its cost.")
    r.add_argument("case", metavar="CASE")
    r.add_argument("-o", "--output", metavar="FILE.md", help="default: stdout")
    r.add_argument("--cost-scenarios", type=int, default=30, metavar="N",
                   help="generated scenarios per row of the cost table (default 30)")
    r.set_defaults(handler=_cmd_export_report)


def _load(path: str) -> Case:
    from mambafuzz.store import corpus

    try:
        return corpus.load_case(path)
    except corpus.CaseError as exc:
        raise UsageError(str(exc)) from None


def _cmd_export_test(args) -> int:
    from mambafuzz.store.corpus import atomic_write

    case = _load(args.case)
    title, _ = finding_analysis(fix_dir(case))
    try:
        source = vllm_test_source(case, title) if args.style == "vllm" else test_source(case, title)
        atomic_write(args.output, source)
    except ExportError as exc:
        raise UsageError(f"{args.case}: {exc}") from None
    print(f"wrote {args.output}")
    return 0


def _cmd_export_report(args) -> int:
    from mambafuzz.store.corpus import atomic_write

    case = _load(args.case)
    try:
        text = report_text(case, args.cost_scenarios)
    except ExportError as exc:
        raise UsageError(f"{args.case}: {exc}") from None
    if args.output:
        atomic_write(args.output, text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0
