import sys

from edge.commands.cli import main

sys.exit(main())
