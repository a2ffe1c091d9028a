"""``python -m overmind ...`` is the ``overmind`` command (``overmind.cli.main``)."""
import sys

from .cli.main import main

sys.exit(main())
