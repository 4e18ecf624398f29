"""Exit codes shared by every mambafuzz command, so scripts and CI can tell a finding from a
broken tool."""

EXIT_CLEAN = 0  # ran, nothing found
EXIT_FOUND = 1  # ran, a violation was found
EXIT_USAGE = 2  # bad arguments or bad input
EXIT_TOOL = 3  # the tool cannot run here (e.g. an unsupported vLLM)
