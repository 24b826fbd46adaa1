"""The ``ckpt-chaos`` subcommands, one module for each concern; ``ckpt_chaos/cli.py`` parses the
command line and calls them. None imports more than the standard library at module level: the CLI
starts fast, and the harness never imports torch."""
