"""`python -m tilefarm ...` is the `tilefarm` command."""

import sys

from tilefarm.entry import main

sys.exit(main())
