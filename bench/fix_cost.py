"""What a candidate fix costs (see mambafuzz/tools/fix_cost.py):

    python bench/fix_cost.py corpus/upstream/NAME/fix.py [--random N] [--seed S]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mambafuzz.tools.fix_cost import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
