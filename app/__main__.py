"""`python -m app` runs the tunedash command."""

import sys

from app.cli.main import main

sys.exit(main())
