"""``python -m compiler.plan``: the plan CLI (``compiler.plan.cli``)."""
import sys

from compiler.plan.cli import main

sys.exit(main())
