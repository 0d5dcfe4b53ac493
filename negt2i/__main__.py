import sys

from negt2i.cli import main

sys.exit(main())
