"""`python -m tilefarm ...` is the `tilefarm` command."""

import sys

from tilefarm.cli import main

sys.exit(main())
