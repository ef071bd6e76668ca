import sys

from bench.agent_replay.harness import main

sys.exit(main())
