"""``python -m llmgw.agent.simulator``: the same as the ``llmgw-simulator`` console script."""

from .main import main

raise SystemExit(main())
