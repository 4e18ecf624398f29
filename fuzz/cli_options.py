"""Options several `mambafuzz` commands share, defined once (and apart from the modules that
import vLLM, so that `--help` stays fast)."""

SPLIT_HELP = ("chunk split under test: fixed (installed vLLM, default), prefix (pre-fix behaviour, both gates), "
              "realign (only the pre-fix mid-block realign gate), or package.module:function "
              "(same signature as Scheduler._mamba_block_aligned_split)")
