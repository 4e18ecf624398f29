"""`python -m fuzz.cli`: the same as the `mambafuzz` command."""
import sys

from fuzz.cli.main import main

sys.exit(main())
