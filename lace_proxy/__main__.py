"""`python -m lace_proxy` is the `lace-proxy` command."""

import sys

from lace_proxy.cli import main

sys.exit(main())
