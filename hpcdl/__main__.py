"""python -m hpcdl: the same as the `hpcdl` command."""
import sys

from .cli.main import main

sys.exit(main())
