import sys

from edged.cli.commands import main

sys.exit(main())
