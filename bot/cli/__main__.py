"""``python -m bot.cli``: the same as ``botctl``."""

import sys

from bot.cli.main import main

sys.exit(main())
