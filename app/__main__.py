"""`python -m app` runs the tunedash command."""

import sys

from app.cli import main

sys.exit(main())
