"""Mutation testing, in one place: bugs planted in the installed vLLM to measure what the fuzzer
finds. `planted` (hand-planted bugs), `operators` (every first-order mutant mutmut's operators
make of vLLM's mamba scheduling functions) and `statements` (the rule that keeps a large
function's mutants that concern align mode); `planting` (a mutant by name, `MAMBAFUZZ_MUTANT`,
which a process's start-up step plants); `kills` (whether a finding kills a mutant, and what
cases say of a survivor); `fork_server` and `tables` (the mutation run's campaigns and its
table). docs/MUTATION.md says how they are used.
"""
