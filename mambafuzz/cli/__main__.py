"""`python -m mambafuzz.cli`: the same as the `mambafuzz` command."""
import sys

from mambafuzz.cli.main import main

sys.exit(main())
