"""Build the tiny qwen3_next checkpoint the engine tier runs, locally, on first use.

Why built and not shipped: a checkpoint is binary and megabytes; the project ships only
`mambafuzz/tiny_model/config.json`.  Why real random weights and not `load_format="dummy"`:
dummy weights make a context-blind model (every output repeats one token), so a truncated
mamba state could never change an output.  Weights drawn with a fixed seed and a wide
`initializer_range`, plus a slow GDN decay (see A_RANGE), give greedy outputs that depend
on early context through the recurrent state, which is what lets a poisoned prefix-cache
entry show up as a token divergence (tests/engine_tier/test_engine_tier.py checks both); a fixed MoE
routing (see STABLE_ROUTING) keeps bf16 noise from doing the same.  Building takes a few
seconds and writes about 8 MB (MTP weights included, see MTP below).

The checkpoint lands in `$XDG_CACHE_HOME/mambafuzz/tiny-qwen3-next-<hash>` (default
`~/.cache`); the hash covers the config, the recipe, the seed and the library versions, so a change
of any of them builds a fresh directory.  It is built in a temporary sibling and renamed
into place, so a crash or a concurrent builder never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

CONFIG_PATH = Path(__file__).resolve().parent.parent / "tiny_model" / "config.json"
SEED = 1234
INITIALIZER_RANGE = 0.2
BUILD_VERSION = 4  # bump when the recipe below changes (4: MTP weights added; the main model is unchanged)
# GDN decay per token is exp(-exp(A_log) * softplus(a + dt_bias)).  The library's init draws
# A in [0.01, 16] and dt_bias = 1, i.e. a state that forgets everything within a token or
# two, which hides a wrong (truncated) mamba state from the outputs.  These give a memory
# of hundreds of tokens, so a state restored from the wrong offset changes what follows.
A_RANGE = (0.001, 0.01)
DT_BIAS = -2.0
# STABLE_ROUTING: the MoE router's top-2-of-4 choice is discontinuous, so a bf16 rounding
# difference (a prefill cut at another offset) can flip an expert and change the output by
# a whole nat; cached and uncached runs then disagree for no cache reason.  A zero router
# weight makes every router logit equal, so the choice is fixed (experts 0 and 1) and the
# model is a continuous function of its inputs.
# MTP: the config declares one next-token-prediction layer (num_nextn_predict_layers), but the
# transformers class has no MTP module and saves no `mtp.*` weights, and vLLM's Qwen3NextMTP
# drafter refuses to start without them ("weights were not initialized from checkpoint").  They
# go in a separate file (vLLM's main model drops `mtp.*`): the decoder layer is a copy of the
# last full-attention layer, the three norms copy the final norm, and `fc` is drawn from its
# own generator, so the main model's weights are bit-identical to a build without them.
MTP_SEED = 4321


def _versions() -> str:
    import torch
    import transformers

    return f"recipe{BUILD_VERSION}/torch{torch.__version__}/transformers{transformers.__version__}/seed{SEED}"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mambafuzz"


def model_dir() -> Path:
    """Where the checkpoint for the shipped config and this recipe lives (built or not)."""
    digest = hashlib.sha256(CONFIG_PATH.read_bytes() + _versions().encode()).hexdigest()[:12]
    return cache_root() / f"tiny-qwen3-next-{digest}"


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def ensure_model() -> Path:
    """Return the checkpoint directory, building it (about 3 s, 8 MB) if it is missing."""
    target = model_dir()
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        _build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):  # not a concurrent builder's success: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build(out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads(CONFIG_PATH.read_text())
    raw["initializer_range"] = INITIALIZER_RANGE
    model_type = raw.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **raw)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = getattr(layer, "linear_attn", None)
            if mixer is None:
                continue
            a = torch.empty(mixer.A_log.shape, dtype=torch.float32).uniform_(*A_RANGE)
            mixer.A_log.copy_(a.log().to(mixer.A_log.dtype))
            mixer.dt_bias.fill_(DT_BIAS)
        for layer in model.model.layers:
            router = getattr(getattr(layer, "mlp", None), "gate", None)
            if router is not None and hasattr(router, "weight"):
                router.weight.zero_()  # see STABLE_ROUTING
    model.save_pretrained(str(out))
    _save_mtp(model, raw, out)


def _save_mtp(model, raw: dict, out: Path) -> None:
    """Write `mtp.safetensors` (see MTP above)."""
    import torch
    from safetensors.torch import save_file

    state = model.state_dict()
    last_attn = max(i for i, kind in enumerate(raw["layer_types"]) if kind == "full_attention")
    src = f"model.layers.{last_attn}."
    mtp = {}
    for layer in range(raw.get("num_nextn_predict_layers", 1)):
        mtp.update({f"mtp.layers.{layer}.{k[len(src):]}": v.clone() for k, v in state.items() if k.startswith(src)})
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        mtp[f"mtp.{norm}.weight"] = state["model.norm.weight"].clone()
    h = raw["hidden_size"]
    gen = torch.Generator().manual_seed(MTP_SEED)
    fc = torch.randn(h, 2 * h, generator=gen) * INITIALIZER_RANGE / 4
    mtp["mtp.fc.weight"] = fc.to(torch.bfloat16)
    save_file({k: v.contiguous() for k, v in mtp.items()}, str(out / "mtp.safetensors"), metadata={"format": "pt"})
