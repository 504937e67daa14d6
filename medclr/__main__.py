import sys

from medclr.cli import main

sys.exit(main())
