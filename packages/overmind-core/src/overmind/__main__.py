"""``python -m overmind ...`` is the ``overmind`` command (see ``overmind.cli``)."""
import sys

from .cli import main

sys.exit(main())
