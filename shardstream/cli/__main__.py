"""``python -m shardstream.cli``: the ``shardstream`` command."""

import sys

from . import main

sys.exit(main())
