"""The ``flower-vfl`` command line (``commands``; own-data subcommands in ``own``)."""

#: flwr 1.42's generated protos (``flwr/proto/*_pb2.py``, gencode 5.29) warn at import under the
#: protobuf 6 runtime that grpcio-health-checking and openmined-psi require; harmless, and printed
#: by every process that imports flwr (this one, ``flwr run``/``log``/``ls``, SuperLink, SuperNodes)
PROTOBUF_GENCODE_WARNING = "Protobuf gencode version"


def quiet_protobuf_gencode_warning(environ=None):
    """Ignore that one warning here and, through ``PYTHONWARNINGS``, in the Flower processes
    this command starts (appended: it wins over the user's own entries for that message only)."""
    import os
    import warnings
    warnings.filterwarnings("ignore", message=PROTOBUF_GENCODE_WARNING, category=UserWarning)
    environ = os.environ if environ is None else environ
    entry = f"ignore:{PROTOBUF_GENCODE_WARNING}:UserWarning"
    if entry not in environ.get("PYTHONWARNINGS", ""):
        environ["PYTHONWARNINGS"] = ",".join(filter(None, [environ.get("PYTHONWARNINGS", ""), entry]))


def main(argv=None):
    """Entry point of ``flower-vfl`` (``pyproject.toml``'s ``[project.scripts]``)."""
    quiet_protobuf_gencode_warning()
    from flower_vfl.cli.commands import main as _main
    return _main(argv)
