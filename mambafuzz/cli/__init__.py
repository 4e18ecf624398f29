"""The command line: `mambafuzz` and its sub-commands, CI reports, the version matrix."""
