"""``python -m specverify``: the same command line as the ``specverify`` script."""

import sys

from specverify.cli import main

sys.exit(main())
