"""A pytest plugin that applies candidate fixes to the installed vLLM before any test runs,
so an exported test (which imports only vLLM) can be checked with and without a fix:

    MAMBAFUZZ_PATCHES=corpus/upstream/NAME/fix.py python -m pytest -p mambafuzz.upstream.fix_plugin test_NAME.py
"""

from __future__ import annotations

import os

from mambafuzz.sim import patching


def pytest_configure(config) -> None:
    specs = os.environ.get("MAMBAFUZZ_PATCHES")
    for spec in specs.split(os.pathsep) if specs else ():
        for p in patching.load_patches(spec):
            patching.apply_one(p)
