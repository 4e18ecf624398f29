"""What the installed vLLM can do, detected from what it has (never from its version string):
which config knobs its classes accept and whether the prefill-checkpoint rule the kernel model
follows exists. Inputs that need an absent feature are refused per input; knobs left at the
value that means "off" are simply not passed."""

from __future__ import annotations

import dataclasses
import inspect
from functools import cache
from typing import Any

from mambafuzz.sim.bridge.vllm_compat.resolve import Missing


@cache
def init_params(cls: type) -> frozenset[str]:
    """The keyword arguments `cls(...)` accepts (pydantic and plain dataclasses alike)."""
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    return frozenset(p for p in inspect.signature(cls).parameters if p != "self")


class FeatureAbsent(ValueError):
    """This input needs a knob the installed vLLM does not have; str() names it."""


def fit_kwargs(cls: type, wanted: dict[str, Any], off: dict[str, tuple], vllm: str) -> dict[str, Any]:
    """`wanted` minus the keys `cls` does not accept. A dropped key whose value is among its `off`
    values (the behaviour of a release without the knob) is fine; any other raises FeatureAbsent."""
    accepted = init_params(cls)
    out: dict[str, Any] = {}
    for key, value in wanted.items():
        if key in accepted:
            out[key] = value
        elif value in off.get(key, ()):
            continue
        else:
            raise FeatureAbsent(f"{vllm} has no {cls.__name__}.{key} (this input sets it to {value!r})")
    return out


def has_prefill_checkpoint_rule(mamba_spec: type, position_fn: object, valid_fn: object) -> bool:
    """Internal prefill checkpoints as the kernel model follows them (vLLM >= 0.30): the
    MambaSpec knobs plus the two functions that say where a checkpoint lands."""
    return (not isinstance(position_fn, Missing) and not isinstance(valid_fn, Missing)
            and {"num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment"} <= init_params(mamba_spec))


def has_runner_choice(vllm_config_cls: type) -> bool:
    """Whether the installed vLLM chooses between Model Runner V1 and V2 (0.32, 0.33: the
    `VllmConfig.use_v2_model_runner` property, read by the Scheduler). vLLM 0.34 removed V1
    (no `gpu_model_runner.py`, no such property; its Scheduler always acts as for V2,
    v1/core/sched/scheduler.py:321), so only V2 inputs can run there."""
    return isinstance(getattr(vllm_config_cls, "use_v2_model_runner", None), property)


V1_BATCH_METHODS = ("add_request", "remove_request", "condense")


def has_v1_accepted_probe(input_batch: object, cached_request_state: object) -> bool:
    """Whether Model Runner V1's persistent batch can be asked how it keeps a request's accepted-
    token count across a skipped step (mambafuzz/sim/worker/v1_accepted_probe.py): the V1 `InputBatch` and
    `CachedRequestState` with the methods `_update_states` calls. Without them the kernel model
    falls back to the rule mirrored from vLLM 0.32 (a re-added request restarts at 1)."""
    return (isinstance(input_batch, type) and isinstance(cached_request_state, type)
            and all(callable(getattr(input_batch, m, None)) for m in V1_BATCH_METHODS))
