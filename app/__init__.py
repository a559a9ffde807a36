"""The command line (`metricsearch ...`) and the web UI."""
