"""`python -m study.cli ...`: the `study` command."""
import sys

from study.cli import main

sys.exit(main())
