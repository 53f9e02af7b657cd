"""The ``flower-vfl`` command line (``commands``; own-data subcommands in ``own``)."""


def main(argv=None):
    """Entry point of ``flower-vfl`` (``pyproject.toml``'s ``[project.scripts]``)."""
    from flower_vfl.cli.commands import main as _main
    return _main(argv)
