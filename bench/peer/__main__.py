import sys

from bench.peer.harness import main

sys.exit(main())
