"""Running on real nodes: a loopback SuperLink + SuperNodes (``local``), the faster SuperNode
(``supernode``, ``warm_exec``) and an in-process Grid for tests and notebooks (``local_grid``)."""
