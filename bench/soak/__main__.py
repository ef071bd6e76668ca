import sys

from bench.soak.harness import main

sys.exit(main())
