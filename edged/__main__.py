import sys

from edged.cli import main

sys.exit(main())
