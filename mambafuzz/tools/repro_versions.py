"""`mambafuzz repro --all-versions FILE...`: replay cases in every vLLM environment found
(mambafuzz/tools/vllm_envs.py: the current one, .venv-vllm-* in the checkout, MAMBAFUZZ_VLLM_ENVS) and say
where each reproduces. Each environment runs `repro --json` in its own interpreter.

"Reproduces" means the same behaviour the file records: its finding's signature, else the kind
its `expected` names for the split; a different violation is reported as such, not counted."""

from __future__ import annotations

import json
from pathlib import Path

from mambafuzz.exit_codes import EXIT_CLEAN, EXIT_FOUND
from mambafuzz.tools.version_matrix import Cell, replay, version_of
from mambafuzz.tools.vllm_envs import discover


def reference_env(path: str, split: str) -> tuple[str | None, str | None]:
    """(signature, kind) the file records for `split`, read without vLLM."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None, None
    finding = raw.get("finding") if isinstance(raw, dict) else None
    if isinstance(finding, dict) and finding.get("split", split) == split and isinstance(finding.get("signature"), str):
        return finding["signature"], finding["signature"].split(":")[0]
    expected = raw.get("expected") if isinstance(raw, dict) else None
    kind = expected.get(split) if isinstance(expected, dict) else None
    return None, kind if isinstance(kind, str) and kind != "clean" else None


def reproduces(cell: Cell, signature: str | None, kind: str | None) -> bool:
    if cell.verdict in ("clean", "cannot run"):
        return False
    if signature is not None:
        return cell.signature == signature
    return kind is None or cell.verdict == kind


def repro_all_versions(files: list[str], split: str) -> int:
    paths = [str(Path(f).resolve()) for f in files]
    results = [(env, version_of(env), replay(env, paths, split)) for env in discover()]
    worst = EXIT_CLEAN
    for f, path in zip(files, paths):
        signature, kind = reference_env(path, split)
        print(f"{f} [split {split}]" + (f" records {signature or kind}:" if signature or kind else ":"))
        where = []
        for env, version, cells in results:
            cell = cells[path]
            label = env.name if env.name == version else f"{env.name} (vLLM {version})"
            if cell.verdict == "cannot run":
                text = cell.reason if cell.reason.startswith("cannot run") else f"cannot run: {cell.reason}"
            elif cell.verdict == "clean":
                text = "clean"
            else:
                same = reproduces(cell, signature, kind)
                text = f"{'REPRODUCES' if same else 'other violation'}: {cell.verdict} ({cell.signature})"
                if same:
                    where.append(label)
                    worst = EXIT_FOUND
            print(f"  {label}: {text}")
        print(f"  reproduces on: {', '.join(where) if where else 'none'}")
    return worst
