"""Allow `python -m metricsearch`."""

from metricsearch.app.cli import main

raise SystemExit(main())
