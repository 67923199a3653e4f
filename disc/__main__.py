import sys

from disc.cli import main

sys.exit(main())
