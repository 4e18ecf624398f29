"""The one description of `--split`, shared by every command that takes it (kept apart from
fuzz.splits, which imports vLLM, so that `--help` stays fast)."""

SPLIT_HELP = ("chunk split under test: fixed (installed vLLM, default), prefix (pre-fix behaviour, both gates), "
              "realign (only the pre-fix mid-block realign gate), or package.module:function "
              "(same signature as Scheduler._mamba_block_aligned_split)")
